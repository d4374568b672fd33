//! The write-ahead log's format.
//!
//! A log written by this build (format 1) starts with a file header, [`FILE_HEADER`] bytes:
//! [`MAGIC`], the format number (u32 BE) and a CRC-32 of those twelve bytes. Then each record
//! is `[length u32 BE][!length u32 BE][checksum u32 BE][payload]`, the checksum a CRC-32 of
//! the length's four bytes and the payload. The length is checked on its own (by its
//! complement), so a reader knows where a record ends even when its payload is damaged.
//!
//! Reading a log back ([`parse`]) stops at the first record that is incomplete or fails a
//! check, and tells two kinds of damage apart:
//! - a **torn tail**: the bytes were never durable (an append that never finished, or zeros a
//!   file system left after extending the file), so nothing durable is lost by cutting them;
//! - **corruption**: the damaged record was durable (Raft's votes and acknowledged entries may
//!   be in it or after it), so the log is refused with the offset of the bad record, and the
//!   replica must not start.
//!
//! When the damaged record's length holds, the record's end is known: it is corruption if a
//! valid record starts right there, and torn otherwise (it ran past the end, or only garbage
//! follows). The reader never looks inside the damaged payload, which may hold bytes a client
//! chose: a frame planted in a value can no longer make a torn final record look like
//! corruption and stop a node from restarting. Only when the length itself is damaged (bit
//! rot in a header: a torn append leaves a prefix, so its header is whole or cut short) does
//! the reader search the bytes after it for any valid record.
//!
//! Logs written before (format 0, no file header, `[length][checksum][payload]`) are still
//! read, with the rule they were written under: a damaged record is corruption if a valid
//! record starts anywhere after it. A node keeps appending to such a log in its format until
//! its next compaction rewrites it in format 1 (`oss.wal`, which is never compacted, stays in
//! format 0 with its rule).
//!
//! Like the rest of the format, this assumes a torn append leaves a prefix of what was
//! written, or zeros: a file system that wrote a record's later pages but not the page
//! holding its length would make the reader search that record's payload.
//!
//! One case no framing can tell from a torn write: damage to the very last durable record.
//! The reader takes it for torn and cuts it.

/// The first bytes of a log in format 1.
pub const MAGIC: [u8; 8] = *b"atomoswl";

/// The format this build writes.
pub const FORMAT: u32 = 1;

/// Bytes of the file header.
pub const FILE_HEADER: usize = 16;

/// Bytes of a record's header in format 1.
pub const HEADER: usize = 12;

/// Bytes of a record's header in format 0.
pub const HEADER_V0: usize = 8;

/// The largest payload a record can hold.
pub const MAX_RECORD: usize = u32::MAX as usize;

fn checksum(len: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_be_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends the file header of a new log in this build's format to `out`.
pub fn file_header(out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT.to_be_bytes());
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// Appends `payload` framed as one record of format `format` (the log's, as [`parse`] found
/// it; [`FORMAT`] for a new log) to `out`.
///
/// # Panics
/// If the payload is larger than [`MAX_RECORD`] (callers check; no record comes near).
pub fn frame(format: u32, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&frame_header(format, payload));
    out.extend_from_slice(payload);
}

/// The bytes that precede `payload` when it is framed as one record of format `format` (see
/// [`frame`]): written before the payload, they frame it without copying it.
///
/// # Panics
/// If the payload is larger than [`MAX_RECORD`] (callers check; no record comes near).
pub fn frame_header(format: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a record under 4 GiB");
    let mut header = Vec::with_capacity(12);
    header.extend_from_slice(&len.to_be_bytes());
    if format >= 1 {
        header.extend_from_slice(&(!len).to_be_bytes());
    }
    header.extend_from_slice(&checksum(len, payload).to_be_bytes());
    header
}

/// What a log's bytes hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// The payloads of the good records, in order.
    pub records: Vec<Vec<u8>>,
    /// Where each good record starts.
    pub starts: Vec<usize>,
    /// Bytes taken by the file header and those records: the log must be cut back to this
    /// length.
    pub good_len: usize,
    /// The log's format: appends must frame records in it. An empty log (or one whose file
    /// header was torn) is in this build's format, with no header yet (`good_len` 0).
    pub format: u32,
}

impl Parsed {
    /// Whether a torn tail follows the good records (`total` is the log's length).
    pub fn torn(&self, total: usize) -> bool {
        self.good_len < total
    }
}

/// A record before the end of a log is damaged (or the log's file header is, or names a
/// format this build does not read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corrupt {
    /// Where the damaged record starts.
    pub offset: usize,
    /// Good records before it.
    pub records_before: usize,
}

/// A format-1 record's length, if the header at the start of `rest` is whole and its length
/// passes its check.
fn length_at(rest: &[u8]) -> Option<usize> {
    let h = rest.get(..HEADER)?;
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    let check = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    (check == !len).then_some(len as usize)
}

/// The format-1 record at the start of `rest`, if it is complete and passes both checks.
fn record_at(rest: &[u8]) -> Option<&[u8]> {
    let len = length_at(rest)?;
    let crc = u32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
    let payload = rest.get(HEADER..HEADER.checked_add(len)?)?;
    (checksum(len as u32, payload) == crc).then_some(payload)
}

/// The format-0 record at the start of `rest`, if it is complete and its checksum holds.
fn record_at_v0(rest: &[u8]) -> Option<&[u8]> {
    let header = rest.get(..HEADER_V0)?;
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let payload = rest.get(HEADER_V0..HEADER_V0.checked_add(len as usize)?)?;
    (checksum(len, payload) == crc).then_some(payload)
}

/// Splits a log into records: the good ones and how many bytes they take (a torn tail is left
/// out), or where a damaged record sits that durable records follow.
pub fn parse(bytes: &[u8]) -> Result<Parsed, Corrupt> {
    let corrupt_header = Corrupt {
        offset: 0,
        records_before: 0,
    };
    if bytes.len() < FILE_HEADER && MAGIC.starts_with(&bytes[..bytes.len().min(MAGIC.len())]) {
        // Empty, or the file header itself was torn: no record was ever durable here.
        return Ok(Parsed {
            records: Vec::new(),
            starts: Vec::new(),
            good_len: 0,
            format: FORMAT,
        });
    }
    if bytes.starts_with(&MAGIC) {
        let format = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        let crc = u32::from_be_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        if crc != crc32fast::hash(&bytes[..12]) || format != 1 {
            return Err(corrupt_header);
        }
        return parse_v1(bytes);
    }
    // No magic: a log of format 0 if its first record holds, else a log of format 1 whose
    // header is damaged when a record of that format starts right after where the header
    // ends (a format-0 log's first record may hold those bytes: it is checked first).
    if record_at_v0(bytes).is_none()
        && bytes
            .get(FILE_HEADER..)
            .is_some_and(|rest| record_at(rest).is_some())
    {
        return Err(corrupt_header);
    }
    parse_v0(bytes)
}

fn parse_v1(bytes: &[u8]) -> Result<Parsed, Corrupt> {
    let mut records = Vec::new();
    let mut starts = Vec::new();
    let mut at = FILE_HEADER;
    while at < bytes.len() {
        if let Some(payload) = record_at(&bytes[at..]) {
            records.push(payload.to_vec());
            starts.push(at);
            at += HEADER + payload.len();
            continue;
        }
        let durable_after = match length_at(&bytes[at..]) {
            // The length holds: the record ends at a known place, and it was durable if a
            // valid record starts there (its payload is never searched).
            Some(len) => at
                .checked_add(HEADER + len)
                .and_then(|end| bytes.get(end..))
                .is_some_and(|rest| record_at(rest).is_some()),
            // The length is damaged or cut short: any valid record after it shows it was
            // durable (a torn append leaves its header whole or short, never wrong).
            None => (at + 1..bytes.len()).any(|y| record_at(&bytes[y..]).is_some()),
        };
        if durable_after {
            return Err(Corrupt {
                offset: at,
                records_before: records.len(),
            });
        }
        break;
    }
    Ok(Parsed {
        records,
        starts,
        good_len: at,
        format: 1,
    })
}

fn parse_v0(bytes: &[u8]) -> Result<Parsed, Corrupt> {
    let mut records = Vec::new();
    let mut starts = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match record_at_v0(&bytes[at..]) {
            Some(payload) => {
                records.push(payload.to_vec());
                starts.push(at);
                at += HEADER_V0 + payload.len();
            }
            None => {
                // Damaged or incomplete: torn only if no valid record starts anywhere after.
                let later = (at + 1..bytes.len()).any(|y| record_at_v0(&bytes[y..]).is_some());
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
        starts,
        good_len: at,
        format: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log in this build's format.
    fn log(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        file_header(&mut out);
        for p in payloads {
            frame(FORMAT, p, &mut out);
        }
        out
    }

    /// A log as builds before format 1 wrote it.
    fn log_v0(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            frame(0, p, &mut out);
        }
        out
    }

    #[test]
    fn records_read_back_in_order() {
        for (bytes, format) in [
            (log(&[b"one", b"", b"three"]), 1),
            (log_v0(&[b"one", b"", b"three"]), 0),
        ] {
            let p = parse(&bytes).unwrap();
            assert_eq!(p.records, vec![b"one".to_vec(), vec![], b"three".to_vec()]);
            assert_eq!(p.good_len, bytes.len());
            assert_eq!(p.format, format);
            assert!(!p.torn(bytes.len()));
        }
        let empty = parse(&[]).unwrap();
        assert_eq!(
            (empty.records.len(), empty.good_len, empty.format),
            (0, 0, FORMAT)
        );
    }

    #[test]
    fn a_torn_final_record_is_left_out() {
        for (full, two) in [
            (
                log(&[b"one", b"two", b"three"]),
                log(&[b"one", b"two"]).len(),
            ),
            (
                log_v0(&[b"one", b"two", b"three"]),
                log_v0(&[b"one", b"two"]).len(),
            ),
        ] {
            for cut in two + 1..full.len() {
                let p = parse(&full[..cut]).unwrap();
                assert_eq!(p.records.len(), 2, "cut at {cut}");
                assert_eq!(p.good_len, two);
                assert!(p.torn(cut));
            }
            // The final record complete in length but with garbage inside (a torn write the
            // file system padded) is torn too.
            let mut bad = full.clone();
            let last = bad.len() - 1;
            bad[last] ^= 0x55;
            assert_eq!(parse(&bad).unwrap().good_len, two);
        }
        // A torn file header: nothing was durable.
        let header = log(&[]);
        for cut in 0..header.len() {
            assert_eq!(parse(&header[..cut]).unwrap().good_len, 0, "cut at {cut}");
        }
    }

    #[test]
    fn a_damaged_record_before_the_tail_is_corruption() {
        for (bytes, second, header) in [
            (
                log(&[b"one", b"two", b"three"]),
                log(&[b"one"]).len(),
                HEADER,
            ),
            (
                log_v0(&[b"one", b"two", b"three"]),
                log_v0(&[b"one"]).len(),
                HEADER_V0,
            ),
        ] {
            let mut bad = bytes.clone();
            bad[second + header] ^= 1; // a payload byte of "two"
            assert_eq!(
                parse(&bad),
                Err(Corrupt {
                    offset: second,
                    records_before: 1
                })
            );
            let mut bad = bytes.clone();
            bad[second + header - 1] ^= 1; // the checksum of "two"
            assert_eq!(parse(&bad).unwrap_err().offset, second);
            // A length damaged to run past the end is not taken for a torn tail.
            let mut bad = bytes;
            bad[second] = 0x7f;
            assert_eq!(parse(&bad).unwrap_err().offset, second);
        }
    }

    #[test]
    fn a_damaged_file_header_is_corruption() {
        let bytes = log(&[b"one", b"two"]);
        for at in 0..FILE_HEADER {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert_eq!(parse(&bad).unwrap_err().offset, 0, "byte {at}");
        }
        // A format this build does not know.
        let mut future = bytes.clone();
        future[8..12].copy_from_slice(&2u32.to_be_bytes());
        let crc = crc32fast::hash(&future[..12]);
        future[12..16].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(parse(&future).unwrap_err().offset, 0);
    }

    #[test]
    fn zeros_or_garbage_after_the_last_record_are_a_torn_tail() {
        for mut bytes in [log(&[b"one", b"two"]), log_v0(&[b"one", b"two"])] {
            let good = bytes.len();
            bytes.extend_from_slice(&[0; 4096]);
            let p = parse(&bytes).unwrap();
            assert_eq!((p.records.len(), p.good_len), (2, good));
            bytes.truncate(good);
            bytes.extend((0..3000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
            assert_eq!(parse(&bytes).unwrap().good_len, good);
        }
    }

    /// A log of format 0 whose first record holds, where a file header would end, bytes that
    /// form a record of format 1: it is read as format 0, not refused as a damaged header.
    #[test]
    fn a_format_0_log_holding_a_format_1_record_in_its_first_value_is_read() {
        let mut planted = b"12345678".to_vec();
        frame(FORMAT, b"a client's bytes", &mut planted);
        let bytes = log_v0(&[&planted, b"two"]);
        let p = parse(&bytes).unwrap();
        assert_eq!((p.format, p.records.len()), (0, 2));
    }

    /// A client's value holding a well-formed record, torn in the crash of its append: the
    /// tail is torn, not corruption (format 0 searched the torn payload, found the planted
    /// record and refused to start).
    #[test]
    fn a_record_planted_in_a_torn_value_is_not_taken_for_a_durable_one() {
        let mut planted = Vec::new();
        frame(FORMAT, b"a client's bytes", &mut planted);
        frame(0, b"a client's bytes", &mut planted);
        let mut value = b"prefix ".to_vec();
        value.extend_from_slice(&planted);
        value.extend_from_slice(&[7; 64]);
        for (mut bytes, format) in [(log(&[b"one"]), FORMAT), (log_v0(&[b"one"]), 0)] {
            let good = bytes.len();
            let mut record = Vec::new();
            frame(format, &value, &mut record);
            // Torn after the planted record, before the end of the value.
            bytes.extend_from_slice(&record[..record.len() - 10]);
            let parsed = parse(&bytes);
            if format == 0 {
                assert!(
                    parsed.is_err(),
                    "format 0 searched the value (the flaw it has)"
                );
            } else {
                assert_eq!(parsed.unwrap().good_len, good);
            }
        }
    }
}
