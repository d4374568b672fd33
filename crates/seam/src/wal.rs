//! The write-ahead log's framing: each record is `[length u32 BE][crc32 u32 BE][payload]`.
//!
//! Reading a log back ([`parse`]) distinguishes two kinds of damage:
//! - a **torn tail**: the last record is incomplete (its header or payload runs past the end of
//!   the file) or it reaches exactly to the end and its checksum fails. That is what a crash in
//!   the middle of an append leaves; the record was never durable, so nothing durable is lost
//!   by cutting it.
//! - **corruption**: a record whose checksum fails with more bytes after it. Cutting there would
//!   forget records that were durable (for Raft: votes and acknowledged entries), so the log is
//!   refused with the offset of the bad record, and the replica must not start from it.

/// Bytes of a record's header.
pub const HEADER: usize = 8;

/// Appends `payload` framed as one record to `out`.
///
/// # Panics
/// If the payload is 4 GiB or larger (no record comes near: frames are bounded far below).
pub fn frame(payload: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(payload.len()).expect("a record under 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
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
    /// Whether a torn final record follows the good ones (`total` is the log's length).
    pub fn torn(&self, total: usize) -> bool {
        self.good_len < total
    }
}

/// A record in the middle of a log is damaged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corrupt {
    /// Where the damaged record starts.
    pub offset: usize,
    /// Good records before it.
    pub records_before: usize,
}

/// Splits a log into records: the good ones and how many bytes they take (a torn final record
/// is left out), or where a damaged record sits that is not the last.
pub fn parse(bytes: &[u8]) -> Result<Parsed, Corrupt> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < HEADER {
            break; // a torn header
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let Some(payload) = rest.get(HEADER..HEADER + len) else {
            break; // a torn payload
        };
        if crc32fast::hash(payload) != crc {
            if HEADER + len == rest.len() {
                break; // the final record, torn inside
            }
            return Err(Corrupt {
                offset: at,
                records_before: records.len(),
            });
        }
        records.push(payload.to_vec());
        at += HEADER + len;
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
        let mut bad = bytes;
        bad[5] ^= 1; // the checksum of "one"
        assert_eq!(parse(&bad).unwrap_err().offset, 0);
    }
}
