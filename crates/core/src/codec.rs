//! How an object's value travels as bytes: a fingerprint of its type, then its postcard
//! encoding. Values are encoded only when they leave the node (remote commits, certification
//! requests, snapshots); locally they stay typed.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A fingerprint of `T`'s name (FNV-1a), stored before each encoded value so that a value is
/// never decoded as another type whose encoding happens to parse. Nodes of one cluster must run
/// the same build (type names are not stable across compiler versions).
pub(crate) fn type_tag<T>() -> [u8; 8] {
    std::any::type_name::<T>()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        })
        .to_le_bytes()
}

/// `value` as tagged bytes.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_extend(value, type_tag::<T>().to_vec())
}

/// Whether `bytes` carry a value of type `T` (by its tag; the encoding is not checked).
pub(crate) fn is_tagged<T>(bytes: &[u8]) -> bool {
    bytes.starts_with(&type_tag::<T>())
}

/// The `T` that `bytes` hold, if they are tagged as a `T` and decode whole.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let payload = bytes.strip_prefix(&type_tag::<T>())?;
    match postcard::take_from_bytes::<T>(payload) {
        Ok((v, [])) => Some(v),
        _ => None,
    }
}
