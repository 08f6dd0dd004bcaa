//! The write-ahead log: the durable copy of every committed batch until sled's own files are synced.
//!
//! A batch is acknowledged once its record is appended here and `sync_data` returns. sled then receives the
//! same operations in memory, and its files are synced later, in the background, by a checkpoint; once a
//! checkpoint has synced sled, the log files it covers are deleted. On start, whatever log files remain are
//! replayed into sled before anything reads it.
//!
//! Replaying is safe whatever part of those batches sled already holds, because every operation is absolute
//! (put this value, remove this key): for each key, the last operation on it decides, and keys the log does not
//! touch keep the value the last checkpoint made durable.
//!
//! A record is `len: u32 LE`, `crc32(payload): u32 LE`, then the payload: operations, each a tag byte (1 insert,
//! 2 remove), the tree index byte, the key's length (u32 LE) and bytes, and for an insert the value's length
//! and bytes. A record that is cut short or fails its checksum ends that file's replay: it can only be a write
//! that failed, and a failed write is never acknowledged (the writer truncates it away or stops writing).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::writer::Op;
use super::StoreError;

const HEADER: usize = 8;
const INSERT: u8 = 1;
const REMOVE: u8 = 2;
/// One record holds one batch; anything larger than this cannot be a batch the writer made.
const MAX_RECORD: usize = 1 << 30;

fn io(context: &str) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |e| StoreError::Io(format!("write-ahead log: {context}: {e}"))
}

pub(crate) fn wal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("wal")
}

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

/// A log file whose batches a checkpoint made durable in sled, renamed so that no replay reads it again.
const RETIRED: &str = "retired";

/// How much of a retired file one truncation frees. ext4 frees a log file's blocks (many small extents, the
/// file grew by small synced appends) inside one journal transaction, and every `fdatasync` of the live log
/// waits for that transaction: timed at 1,250 payments/s, unlinking a 43 MB log file whole took 53-57 ms
/// and the writer's appends stalled up to 18 ms meanwhile. Freed 4 MiB at a time with a pause between, the
/// appends go on in between; the same timing showed no stalled append during a deletion any more.
const RETIRE_STEP: u64 = 4 * 1024 * 1024;
const RETIRE_PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

/// Takes the log files numbered below `before` out of any future replay: renames each to `<seq>.retired`,
/// oldest first, then syncs the directory. Only for files whose every batch sled already holds durably.
///
/// The rename comes before any truncation because a replay of a shortened file would be wrong: it would
/// end at the cut and re-apply older values of keys that the lost tail had changed again.
pub(crate) fn retire(dir: &Path, before: u64) -> Result<(), StoreError> {
    let mut renamed = false;
    for (seq, path) in list(dir)? {
        if seq < before {
            std::fs::rename(&path, dir.join(format!("{seq:016x}.{RETIRED}"))).map_err(io("retire"))?;
            renamed = true;
        }
    }
    if renamed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Deletes retired log files, a few megabytes at a time (see [`RETIRE_STEP`]). A crash midway leaves a
/// retired file behind, which the next call deletes; nothing ever replays it.
pub(crate) fn remove_retired(dir: &Path) -> Result<(), StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("list")(e)),
    };
    for entry in entries {
        let path = entry.map_err(io("list"))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some(RETIRED) {
            continue;
        }
        let file = OpenOptions::new().write(true).open(&path).map_err(io("open a retired file"))?;
        let mut len = file.metadata().map_err(io("stat a retired file"))?.len();
        while len > 0 {
            len = len.saturating_sub(RETIRE_STEP);
            file.set_len(len).map_err(io("shrink a retired file"))?;
            if len > 0 {
                std::thread::sleep(RETIRE_PAUSE);
            }
        }
        drop(file);
        std::fs::remove_file(&path).map_err(io("remove a retired file"))?;
    }
    Ok(())
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io("sync directory"))
}

/// Appends `ops` as one record to `out`.
pub(crate) fn encode<'a>(ops: impl Iterator<Item = &'a Op>, out: &mut Vec<u8>) -> Result<(), StoreError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    for op in ops {
        let (tag, tree, key, value) = match op {
            Op::Insert(tree, key, value) => (INSERT, *tree, key, Some(value)),
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
    if payload > MAX_RECORD {
        return Err(StoreError::Io(format!("write-ahead log: a batch of {payload} bytes is too large")));
    }
    let crc = crc32fast::hash(&out[start + HEADER..]);
    out[start..start + 4].copy_from_slice(&(payload as u32).to_le_bytes());
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), StoreError> {
    let len = u32::try_from(bytes.len()).map_err(|_| StoreError::Io("write-ahead log: value too large".into()))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

/// What reading one log file found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Replayed {
    pub records: u64,
    pub ops: u64,
    /// Bytes after the last good record: a write that failed before it was acknowledged.
    pub discarded: u64,
}

/// Reads the records of one log file in order and hands each one's operations to `apply`.
pub(crate) fn replay(
    path: &Path,
    mut apply: impl FnMut(Vec<Op>) -> Result<(), StoreError>,
) -> Result<Replayed, StoreError> {
    let bytes = std::fs::read(path).map_err(io("read"))?;
    let mut found = Replayed::default();
    let mut at = 0;
    while let Some(ops) = record_at(&bytes, at) {
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
fn record_at(bytes: &[u8], at: usize) -> Option<Result<(Vec<Op>, usize), StoreError>> {
    let header = bytes.get(at..at + HEADER)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let payload = bytes.get(at + HEADER..at + HEADER + len)?;
    if crc32fast::hash(payload) != crc {
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

/// The log file being appended to.
pub(crate) struct Wal {
    dir: PathBuf,
    file: File,
    seq: u64,
    /// Length up to the end of the last record known durable.
    durable_len: u64,
}

impl Wal {
    /// Creates log file `seq` (it must not exist) and makes its name durable.
    pub(crate) fn create(dir: &Path, seq: u64) -> Result<Wal, StoreError> {
        std::fs::create_dir_all(dir).map_err(io("create directory"))?;
        let file =
            OpenOptions::new().create_new(true).append(true).open(dir.join(file_name(seq))).map_err(io("create"))?;
        sync_dir(dir)?;
        Ok(Wal { dir: dir.to_path_buf(), file, seq, durable_len: 0 })
    }

    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    pub(crate) fn len(&self) -> u64 {
        self.durable_len
    }

    /// Appends `bytes` (whole records) and syncs them. On failure, whatever part of them reached the file is
    /// cut off again, so that a later record is never hidden behind a torn one; if even that fails, the log is
    /// no longer trustworthy and the error says so (the writer then refuses every write until a restart).
    pub(crate) fn append(&mut self, bytes: &[u8]) -> Result<(), AppendError> {
        match self.file.write_all(bytes).and_then(|()| self.file.sync_data()) {
            Ok(()) => {
                self.durable_len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                let failed = io("append")(e);
                match self.cut_back() {
                    Ok(()) => Err(AppendError::Refused(failed)),
                    Err(cut) => Err(AppendError::Broken(StoreError::Io(format!("{failed}; then {cut}")))),
                }
            }
        }
    }

    fn cut_back(&mut self) -> Result<(), StoreError> {
        let len = self.file.metadata().map_err(io("stat after a failed append"))?.len();
        if len == self.durable_len {
            return Ok(());
        }
        self.file.set_len(self.durable_len).map_err(io("cut a failed append"))?;
        self.file.sync_all().map_err(io("sync the cut"))
    }

    /// Tests whether a batch of `size` bytes would be written now: writes that many zero bytes after the last
    /// record, syncs them, and cuts them off again. A tiny probe would lie on a full disk, where a partly used
    /// last page still takes a few bytes but no real batch.
    pub(crate) fn probe(&mut self, size: usize) -> Result<(), AppendError> {
        let zeros = vec![0u8; size];
        let written = self.file.write_all(&zeros).and_then(|()| self.file.sync_data());
        let cut = self.cut_back();
        match (written, cut) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(e), Ok(())) => Err(AppendError::Refused(io("probe")(e))),
            (_, Err(cut)) => Err(AppendError::Broken(cut)),
        }
    }

    /// The next log file, for a checkpoint to cover everything before it.
    pub(crate) fn rotate(&self) -> Result<Wal, StoreError> {
        Wal::create(&self.dir, self.seq + 1)
    }
}

#[derive(Debug)]
pub(crate) enum AppendError {
    /// Nothing of the batch is in the log; later appends may succeed.
    Refused(StoreError),
    /// The log may hold part of a refused batch: writing on would risk replaying it.
    Broken(StoreError),
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
                    Op::Insert(t, k, v) => (1, *t, k.clone(), Some(v.clone())),
                    Op::Remove(t, k) => (2, *t, k.clone(), None),
                })
                .collect::<Vec<_>>()
        };
        flat(a) == flat(b)
    }

    #[test]
    fn records_replay_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), 7).unwrap();
        let mut bytes = Vec::new();
        encode(sample().iter(), &mut bytes).unwrap();
        encode(sample()[..1].iter(), &mut bytes).unwrap();
        wal.append(&bytes).unwrap();
        let files = list(dir.path()).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].0, 7);
        let mut seen = Vec::new();
        let found = replay(&files[0].1, |ops| {
            seen.push(ops);
            Ok(())
        })
        .unwrap();
        assert_eq!(found, Replayed { records: 2, ops: 4, discarded: 0 });
        assert!(same(&seen[0], &sample()));
        assert!(same(&seen[1], &sample()[..1]));
    }

    #[test]
    fn a_torn_or_damaged_tail_ends_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        encode(sample().iter(), &mut bytes).unwrap();
        let whole = bytes.len();
        encode(sample().iter(), &mut bytes).unwrap();
        for cut in [whole + 1, whole + HEADER, bytes.len() - 1] {
            let path = dir.path().join(file_name(cut as u64));
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let found = replay(&path, |_| Ok(())).unwrap();
            assert_eq!((found.records, found.discarded), (1, (cut - whole) as u64), "cut at {cut}");
        }
        let mut damaged = bytes.clone();
        damaged[whole + HEADER + 2] ^= 0x40;
        let path = dir.path().join("damaged.wal");
        std::fs::write(&path, &damaged).unwrap();
        assert_eq!(replay(&path, |_| Ok(())).unwrap().records, 1);
    }

    #[test]
    fn a_record_with_a_good_checksum_that_does_not_parse_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let payload = [9u8, 0, 0, 0, 0, 0];
        let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        let path = dir.path().join("bad.wal");
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(replay(&path, |_| Ok(())), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn retired_files_are_never_listed_and_are_removed_later() {
        let dir = tempfile::tempdir().unwrap();
        for seq in [3, 4, 5] {
            let mut wal = Wal::create(dir.path(), seq).unwrap();
            let mut record = Vec::new();
            encode(sample().iter(), &mut record).unwrap();
            wal.append(&record).unwrap();
        }
        // A file bigger than one step, as a long-running log file is.
        let big = dir.path().join(file_name(2));
        std::fs::write(&big, vec![7u8; (RETIRE_STEP * 2 + 10) as usize]).unwrap();
        retire(dir.path(), 5).unwrap();
        let left: Vec<u64> = list(dir.path()).unwrap().into_iter().map(|(seq, _)| seq).collect();
        assert_eq!(left, vec![5]);
        let retired = |d: &Path| {
            std::fs::read_dir(d)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().path().extension() == Some(RETIRED.as_ref()))
                .count()
        };
        assert_eq!(retired(dir.path()), 3);
        remove_retired(dir.path()).unwrap();
        assert_eq!(retired(dir.path()), 0);
        assert_eq!(list(dir.path()).unwrap().len(), 1);
    }

    #[test]
    fn files_list_oldest_first_and_ignore_strangers() {
        let dir = tempfile::tempdir().unwrap();
        for seq in [0x11u64, 2, 0x100] {
            Wal::create(dir.path(), seq).unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), b"").unwrap();
        let seqs: Vec<u64> = list(dir.path()).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(seqs, vec![2, 0x11, 0x100]);
        assert!(Wal::create(dir.path(), 2).is_err(), "an existing log file is never reused");
    }
}
