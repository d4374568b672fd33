//! The write-ahead log's framing: each record is `[length u32 BE][checksum u32 BE][payload]`,
//! the checksum a CRC-32 of the length's four bytes and the payload (so a run of zero bytes is
//! never a valid record, and a damaged length fails the check).
//!
//! Reading a log back ([`parse`]) stops at the first record that is incomplete or fails its
//! checksum, and tells two kinds of damage apart by what follows it:
//! - a **torn tail**: nothing after it is a valid record (the rest is a prefix of an append
//!   that never finished, garbage, or zeros a file system left after extending the file). The
//!   bytes were never durable, so nothing durable is lost by cutting them.
//! - **corruption**: a valid record follows somewhere after it, so the damaged one was durable
//!   (this covers a damaged length field, which makes a record look as if it ran past the end).
//!   Cutting there would forget durable records (for Raft: votes and acknowledged entries), so
//!   the log is refused with the offset of the bad record, and the replica must not start.
//!
//! One case no framing can tell from a torn write: damage to the very last durable record.
//! The reader takes it for torn and cuts it.

/// Bytes of a record's header.
pub const HEADER: usize = 8;

/// The largest payload a record can hold.
pub const MAX_RECORD: usize = u32::MAX as usize;

fn checksum(len: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_be_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends `payload` framed as one record to `out`.
///
/// # Panics
/// If the payload is larger than [`MAX_RECORD`] (callers check; no record comes near).
pub fn frame(payload: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(payload.len()).expect("a record under 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&checksum(len, payload).to_be_bytes());
    out.extend_from_slice(payload);
}

/// What a log's bytes hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// The payloads of the good records, in order.
    pub records: Vec<Vec<u8>>,
    /// Bytes taken by those records: the log must be cut back to this length.
    pub good_len: usize,
}

impl Parsed {
    /// Whether a torn tail follows the good records (`total` is the log's length).
    pub fn torn(&self, total: usize) -> bool {
        self.good_len < total
    }
}

/// A record before the end of a log is damaged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corrupt {
    /// Where the damaged record starts.
    pub offset: usize,
    /// Good records before it.
    pub records_before: usize,
}

/// The record at the start of `rest`, if it is complete and its checksum holds.
fn record_at(rest: &[u8]) -> Option<&[u8]> {
    let header = rest.get(..HEADER)?;
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let payload = rest.get(HEADER..HEADER.checked_add(len as usize)?)?;
    (checksum(len, payload) == crc).then_some(payload)
}

/// Splits a log into records: the good ones and how many bytes they take (a torn tail is left
/// out), or where a damaged record sits that valid records follow.
pub fn parse(bytes: &[u8]) -> Result<Parsed, Corrupt> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match record_at(&bytes[at..]) {
            Some(payload) => {
                records.push(payload.to_vec());
                at += HEADER + payload.len();
            }
            None => {
                // Damaged or incomplete: torn only if no valid record starts anywhere after.
                let later = (at + 1..bytes.len()).any(|y| record_at(&bytes[y..]).is_some());
                if later {
                    return Err(Corrupt {
                        offset: at,
                        records_before: records.len(),
                    });
                }
                break;
            }
        }
    }
    Ok(Parsed {
        records,
        good_len: at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            frame(p, &mut out);
        }
        out
    }

    #[test]
    fn records_read_back_in_order() {
        let bytes = log(&[b"one", b"", b"three"]);
        let p = parse(&bytes).unwrap();
        assert_eq!(p.records, vec![b"one".to_vec(), vec![], b"three".to_vec()]);
        assert_eq!(p.good_len, bytes.len());
        assert!(!p.torn(bytes.len()));
    }

    #[test]
    fn a_torn_final_record_is_left_out() {
        let full = log(&[b"one", b"two", b"three"]);
        let two = log(&[b"one", b"two"]).len();
        for cut in two + 1..full.len() {
            let p = parse(&full[..cut]).unwrap();
            assert_eq!(p.records.len(), 2, "cut at {cut}");
            assert_eq!(p.good_len, two);
            assert!(p.torn(cut));
        }
        // The final record complete in length but with garbage inside (a torn write the file
        // system padded) is torn too.
        let mut bad = full.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x55;
        assert_eq!(parse(&bad).unwrap().good_len, two);
    }

    #[test]
    fn a_damaged_record_before_the_tail_is_corruption() {
        let bytes = log(&[b"one", b"two", b"three"]);
        let second = log(&[b"one"]).len();
        let mut bad = bytes.clone();
        bad[second + HEADER] ^= 1; // a payload byte of "two"
        assert_eq!(
            parse(&bad),
            Err(Corrupt {
                offset: second,
                records_before: 1
            })
        );
        let mut bad = bytes.clone();
        bad[5] ^= 1; // the checksum of "one"
        assert_eq!(parse(&bad).unwrap_err().offset, 0);
        // A length damaged to run past the end is not taken for a torn tail.
        let mut bad = bytes;
        bad[second] = 0x7f;
        assert_eq!(parse(&bad).unwrap_err().offset, second);
    }

    #[test]
    fn zeros_or_garbage_after_the_last_record_are_a_torn_tail() {
        let mut bytes = log(&[b"one", b"two"]);
        let good = bytes.len();
        bytes.extend_from_slice(&[0; 4096]);
        let p = parse(&bytes).unwrap();
        assert_eq!((p.records.len(), p.good_len), (2, good));
        bytes.truncate(good);
        bytes.extend((0..3000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
        assert_eq!(parse(&bytes).unwrap().good_len, good);
    }
}
