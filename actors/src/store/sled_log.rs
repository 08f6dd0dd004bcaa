//! The write-ahead log of stores made on sled, the embedded engine of earlier releases, as the upgrade to
//! fjall reads it. Such a store acknowledged a batch once its record was appended here and synced; sled
//! received the same operations in memory and had its files synced later, by a checkpoint, which then
//! retired the log files it covered. So a store stopped by a crash holds, in sled's files, at least what its
//! last checkpoint made durable, and here everything acknowledged since: the upgrade copies the first and then
//! replays this over it ([`super::fjall_store::upgrade`]). Every operation is absolute (put this value,
//! remove this key), so replaying a batch sled already holds changes nothing.
//!
//! A file starts with a header, the magic `CWAL\x02\0\0\0` and the file's sequence number (u64 LE); the file
//! name carries the same number (`<seq as 16 hex digits>.wal`). Then records: `len: u32 LE`,
//! `crc32(seq ++ payload): u32 LE`, then the payload: operations, each a tag byte (1 insert, 2 remove), the
//! tree index byte, the key's length (u32 LE) and bytes, and for an insert the value's length and bytes. A
//! record that is cut short or fails its checksum ends that file's replay: it can only be a write that failed
//! (never acknowledged), or a record left from the file's previous use, since files were reused, and the
//! sequence number in every checksum is what told a reused file's old records from its new ones. A header that
//! names another number makes the file empty. Files named otherwise (`.retired`, already in sled, and the
//! `spare`) are never read.

use std::path::{Path, PathBuf};

use super::op::Op;
use super::StoreError;

const HEADER: usize = 8;
const MAGIC: [u8; 8] = *b"CWAL\x02\0\0\0";
/// The file header: [`MAGIC`] and the file's sequence number.
const FILE_HEADER: u64 = 16;
const INSERT: u8 = 1;
const REMOVE: u8 = 2;

fn io(context: &str) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |e| StoreError::Io(format!("write-ahead log: {context}: {e}"))
}

/// Where a sled store in `data_dir` kept its log.
pub(crate) fn wal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("wal")
}

#[cfg(test)]
fn file_name(seq: u64) -> String {
    format!("{seq:016x}.wal")
}

/// The log files under `dir`, oldest first.
pub(crate) fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(e) => return Err(io("list")(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io("list"))?;
        let name = entry.file_name();
        let Some(seq) =
            name.to_str().and_then(|n| n.strip_suffix(".wal")).and_then(|s| u64::from_str_radix(s, 16).ok())
        else {
            continue;
        };
        files.push((seq, entry.path()));
    }
    files.sort();
    Ok(files)
}

/// What reading one log file found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Replayed {
    pub records: u64,
    pub ops: u64,
    /// Bytes after the last good record: a write that failed before it was acknowledged, or the old records
    /// of a reused file.
    pub discarded: u64,
}

/// Reads the records of log file `seq` in order and hands each one's operations to `apply`.
pub(crate) fn replay(
    path: &Path,
    seq: u64,
    mut apply: impl FnMut(Vec<Op>) -> Result<(), StoreError>,
) -> Result<Replayed, StoreError> {
    let bytes = std::fs::read(path).map_err(io("read"))?;
    let mut found = Replayed::default();
    let mut at = match bytes.strip_prefix(&MAGIC[..]) {
        Some(rest) if rest.get(..8) == Some(&seq.to_le_bytes()[..]) => FILE_HEADER as usize,
        // A reused file whose new header never reached the disk, or a new file whose header did not (it is made
        // durable by the first append): nothing in it was acknowledged.
        _ => bytes.len(),
    };
    while let Some(ops) = record_at(&bytes, at, seq) {
        let (ops, next) = ops?;
        found.records += 1;
        found.ops += ops.len() as u64;
        apply(ops)?;
        at = next;
    }
    found.discarded = (bytes.len() - at) as u64;
    Ok(found)
}

/// The record at `at`, if a whole one with a good checksum is there. A bad checksum or a short record is the
/// end of the log; a record that passes its checksum but does not parse is corruption.
#[allow(clippy::type_complexity)]
fn record_at(bytes: &[u8], at: usize, seq: u64) -> Option<Result<(Vec<Op>, usize), StoreError>> {
    let header = bytes.get(at..at + HEADER)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let payload = bytes.get(at + HEADER..at + HEADER + len)?;
    if checksum(seq, payload) != crc {
        return None;
    }
    Some(parse(payload).map(|ops| (ops, at + HEADER + len)))
}

fn parse(mut payload: &[u8]) -> Result<Vec<Op>, StoreError> {
    let corrupt = || StoreError::Corrupt("write-ahead log record does not parse".into());
    let mut ops = Vec::new();
    while let [tag, tree, rest @ ..] = payload {
        let tree = usize::from(*tree);
        let (key, rest) = take_bytes(rest).ok_or_else(corrupt)?;
        payload = match *tag {
            INSERT => {
                let (value, rest) = take_bytes(rest).ok_or_else(corrupt)?;
                ops.push(Op::Insert(tree, key.to_vec(), value.to_vec()));
                rest
            }
            REMOVE => {
                ops.push(Op::Remove(tree, key.to_vec()));
                rest
            }
            _ => return Err(corrupt()),
        };
    }
    if payload.is_empty() {
        Ok(ops)
    } else {
        Err(corrupt())
    }
}

fn take_bytes(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let value = bytes.get(4..4 + len)?;
    Some((value, &bytes[4 + len..]))
}

/// A record's checksum: of the file's number and the payload.
fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&seq.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// The bytes of log file `seq` holding `batches`, a record each, as a sled store wrote them.
#[cfg(test)]
pub(crate) fn file(seq: u64, batches: &[Vec<Op>]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&seq.to_le_bytes());
    for ops in batches {
        encode(ops.iter(), seq, &mut bytes).expect("a batch a test makes encodes");
    }
    bytes
}

/// Appends `ops` as one record of log file `seq` to `out`, as a sled store wrote it.
#[cfg(test)]
fn encode<'a>(ops: impl Iterator<Item = &'a Op>, seq: u64, out: &mut Vec<u8>) -> Result<(), StoreError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    for op in ops {
        let (tag, tree, key, value) = match op {
            Op::Insert(tree, key, value) | Op::Create(tree, key, value) => (INSERT, *tree, key, Some(value)),
            Op::Remove(tree, key) => (REMOVE, *tree, key, None),
        };
        let tree = u8::try_from(tree).map_err(|_| StoreError::Corrupt(format!("tree index {tree}")))?;
        out.push(tag);
        out.push(tree);
        put_bytes(out, key)?;
        if let Some(value) = value {
            put_bytes(out, value)?;
        }
    }
    let payload = out.len() - start - HEADER;
    let crc = checksum(seq, &out[start + HEADER..]);
    out[start..start + 4].copy_from_slice(&(payload as u32).to_le_bytes());
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

#[cfg(test)]
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), StoreError> {
    let len = u32::try_from(bytes.len()).map_err(|_| StoreError::Io("write-ahead log: value too large".into()))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Op> {
        vec![
            Op::Insert(3, b"key".to_vec(), b"value".to_vec()),
            Op::Remove(14, b"gone".to_vec()),
            Op::Insert(0, vec![], vec![]),
        ]
    }

    fn same(a: &[Op], b: &[Op]) -> bool {
        let flat = |ops: &[Op]| {
            ops.iter()
                .map(|op| match op {
                    Op::Insert(t, k, v) | Op::Create(t, k, v) => (1, *t, k.clone(), Some(v.clone())),
                    Op::Remove(t, k) => (2, *t, k.clone(), None),
                })
                .collect::<Vec<_>>()
        };
        flat(a) == flat(b)
    }

    /// A log file's bytes: the header of file `seq`, then `records`.
    fn file_with(seq: u64, records: &[u8]) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&seq.to_le_bytes());
        bytes.extend_from_slice(records);
        bytes
    }

    fn replayed(path: &Path, seq: u64) -> (Replayed, Vec<Vec<Op>>) {
        let mut seen = Vec::new();
        let found = replay(path, seq, |ops| {
            seen.push(ops);
            Ok(())
        })
        .unwrap();
        (found, seen)
    }

    /// Log file `seq` under `dir` with `records` records, each one record of [`sample`]; answers its path and
    /// the bytes of one record.
    fn wal_with(dir: &Path, seq: u64, records: usize) -> (PathBuf, Vec<u8>) {
        let mut record = Vec::new();
        encode(sample().iter(), seq, &mut record).unwrap();
        let path = dir.join(file_name(seq));
        std::fs::write(&path, file_with(seq, &record.repeat(records))).unwrap();
        (path, record)
    }

    #[test]
    fn records_replay_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        encode(sample().iter(), 7, &mut bytes).unwrap();
        encode(sample()[..1].iter(), 7, &mut bytes).unwrap();
        std::fs::write(dir.path().join(file_name(7)), file_with(7, &bytes)).unwrap();
        let files = list(dir.path()).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].0, 7);
        let (found, seen) = replayed(&files[0].1, 7);
        assert_eq!(found, Replayed { records: 2, ops: 4, discarded: 0 });
        assert!(same(&seen[0], &sample()));
        assert!(same(&seen[1], &sample()[..1]));
    }

    #[test]
    fn a_torn_or_damaged_tail_ends_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        encode(sample().iter(), 1, &mut bytes).unwrap();
        let whole = bytes.len();
        encode(sample().iter(), 1, &mut bytes).unwrap();
        for cut in [whole + 1, whole + HEADER, bytes.len() - 1] {
            let path = dir.path().join(file_name(1));
            std::fs::write(&path, file_with(1, &bytes[..cut])).unwrap();
            let (found, _) = replayed(&path, 1);
            assert_eq!((found.records, found.discarded), (1, (cut - whole) as u64), "cut at {cut}");
        }
        let mut damaged = bytes.clone();
        damaged[whole + HEADER + 2] ^= 0x40;
        let path = dir.path().join("damaged.wal");
        std::fs::write(&path, file_with(1, &damaged)).unwrap();
        assert_eq!(replayed(&path, 1).0.records, 1);
    }

    #[test]
    fn a_record_with_a_good_checksum_that_does_not_parse_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let payload = [9u8, 0, 0, 0, 0, 0];
        let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&checksum(3, &payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        let path = dir.path().join("bad.wal");
        std::fs::write(&path, file_with(3, &bytes)).unwrap();
        assert!(matches!(replay(&path, 3, |_| Ok(())), Err(StoreError::Corrupt(_))));
    }

    /// A new file whose header never reached the disk (a crash before its first append) holds nothing.
    #[test]
    fn a_file_without_its_header_replays_empty() {
        let dir = tempfile::tempdir().unwrap();
        let (path, record) = wal_with(dir.path(), 9, 1);
        std::fs::write(&path, [vec![0u8; FILE_HEADER as usize], record].concat()).unwrap();
        assert_eq!(replayed(&path, 9).0.records, 0);
    }

    #[test]
    fn a_file_whose_header_names_another_number_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        wal_with(dir.path(), 3, 1);
        let path = dir.path().join(file_name(4));
        std::fs::rename(dir.path().join(file_name(3)), &path).unwrap();
        assert_eq!(replayed(&path, 4).0.records, 0);
    }

    /// A record's bytes are the log's format: this fails when they change, which changes the store's format
    /// (raise `layout::FORMAT_VERSION` with it).
    #[test]
    fn a_records_bytes_are_pinned() {
        let mut bytes = Vec::new();
        encode(sample().iter(), 5, &mut bytes).unwrap();
        let hex = bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex, "260000004c1b77b80103030000006b65790500000076616c7565020e04000000676f6e6501000000000000000000");
        assert_eq!(&MAGIC, b"CWAL\x02\0\0\0");
    }

    #[test]
    fn files_list_oldest_first_and_ignore_strangers() {
        let dir = tempfile::tempdir().unwrap();
        for seq in [0x11u64, 2, 0x100] {
            wal_with(dir.path(), seq, 1);
        }
        for stranger in ["notes.txt", "spare", "0000000000000001.retired"] {
            std::fs::write(dir.path().join(stranger), b"").unwrap();
        }
        let seqs: Vec<u64> = list(dir.path()).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(seqs, vec![2, 0x11, 0x100]);
    }
}
