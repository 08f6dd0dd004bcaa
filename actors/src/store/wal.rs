//! The write-ahead log: the durable copy of every committed batch until sled's own files are synced.
//!
//! A batch is acknowledged once its record is appended here and `sync_data` returns. sled then receives the
//! same operations in memory, and its files are synced later, in the background, by a checkpoint; once a
//! checkpoint has synced sled, the log files it covers are deleted, but one kept for reuse. On start, whatever
//! log files remain are replayed into sled before anything reads it.
//!
//! Replaying is safe whatever part of those batches sled already holds, because every operation is absolute
//! (put this value, remove this key): for each key, the last operation on it decides, and keys the log does not
//! touch keep the value the last checkpoint made durable. The journal's events reach sled as runs whose
//! grouping the replay may not repeat; readers take each event once whatever runs hold it (`layout`).
//!
//! A file starts with a header, the magic `CWAL\x02\0\0\0` and the file's sequence number (u64 LE); the file
//! name carries the same number. Then records: `len: u32 LE`, `crc32(seq ++ payload): u32 LE`, then the
//! payload: operations, each a tag byte (1 insert, 2 remove), the tree index byte, the key's length (u32 LE)
//! and bytes, and for an insert the value's length and bytes. A record that is cut short or fails its checksum
//! ends that file's replay: it can only be a write that failed, and a failed write is never acknowledged (the
//! writer truncates it away or stops writing), or a record left from the file's previous use.
//!
//! Files are reused. A checkpoint keeps one covered file as the spare instead of deleting it, and the next
//! rotation renames it and overwrites it from the start. Overwriting blocks a file already has, without
//! changing its size, lets `fdatasync` skip the filesystem's journal: an append that grows a file must commit
//! the journal, and on ext4 (`data=ordered`) that commit first waits for the data of every other file whose
//! blocks it allocates, here sled's. Measured under load, the API's latency tail is the log's sync (it all but
//! vanishes with the log on tmpfs), and writing over a preallocated file shortens it; reused files gave a lower
//! median than growing ones, while the shared disk's tail varied more between runs than between the two
//! (docs/perf/history.md has the runs).
//!
//! The sequence number in every checksum is what makes reuse safe: a record left from the file's previous
//! use fails it and ends the replay, and a header that names another number (one not yet durable) makes the
//! file empty. That holds only while a number is never used twice, so numbering continues after the spare's
//! number across restarts too ([`spare_seq`]). A reused file gets its new header synced before it is renamed,
//! so no crash leaves it under its new name with the start of its previous content.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::op::Op;
use super::StoreError;

const HEADER: usize = 8;
const MAGIC: [u8; 8] = *b"CWAL\x02\0\0\0";
/// The file header: [`MAGIC`] and the file's sequence number.
const FILE_HEADER: u64 = 16;
/// The name of the covered log file kept for the next rotation to reuse (no `.wal` suffix: never replayed).
const SPARE: &str = "spare";
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
/// waits for that transaction: unlinking a whole log file under load stalled the writer's appends for tens of
/// milliseconds. Freed 4 MiB at a time with a pause between, the appends go on in between, and no append
/// stalled during a deletion any more (docs/perf/history.md has the timings).
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

/// The number the spare was last used as (from its header), `None` when there is no spare or its header is not
/// one this version writes (such a spare replays as empty whatever its new number, see [`replay`]).
pub(crate) fn spare_seq(dir: &Path) -> Result<Option<u64>, StoreError> {
    let mut header = [0u8; FILE_HEADER as usize];
    match File::open(dir.join(SPARE)) {
        Ok(file) => match file.read_exact_at(&mut header, 0) {
            Ok(()) if header[..8] == MAGIC => Ok(Some(u64::from_le_bytes(header[8..].try_into().unwrap_or([0; 8])))),
            Ok(()) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(io("read the spare's header")(e)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("open the spare")(e)),
    }
}

/// Keeps the largest retired log file as the spare when there is none (see the module's doc), and deletes
/// the others, a few megabytes at a time (see [`RETIRE_STEP`]). A crash midway leaves a retired file behind,
/// which the next call deletes; nothing ever replays it.
pub(crate) fn remove_retired(dir: &Path) -> Result<(), StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("list")(e)),
    };
    let mut retired = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io("list"))?;
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) == Some(RETIRED) {
            retired.push((entry.metadata().map_err(io("stat a retired file"))?.len(), path));
        }
    }
    retired.sort();
    let spare = dir.join(SPARE);
    if !spare.exists() {
        if let Some((_, largest)) = retired.pop() {
            // Nothing reads its old records once reused: its header and every record's checksum name
            // another number than the file it becomes.
            std::fs::rename(&largest, &spare).map_err(io("keep a spare"))?;
        }
    }
    for (_, path) in retired {
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

/// Appends `ops` as one record of log file `seq` to `out`.
pub(crate) fn encode<'a>(ops: impl Iterator<Item = &'a Op>, seq: u64, out: &mut Vec<u8>) -> Result<(), StoreError> {
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
    let crc = checksum(seq, &out[start + HEADER..]);
    out[start..start + 4].copy_from_slice(&(payload as u32).to_le_bytes());
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// A record's checksum: of the file's number and the payload.
fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&seq.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
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

/// A spare whose new header is on disk: the only thing [`HeaderSynced::rename`] takes, so the spare can never be
/// renamed before its header is durable. Renamed first, a crash could leave the new name on the old header and
/// old records; with the header first, a file under its new name is read with its new number, which none of
/// the old records carry.
struct HeaderSynced(File);

impl HeaderSynced {
    fn write(spare: &Path, header: &[u8]) -> Result<HeaderSynced, StoreError> {
        let file = OpenOptions::new().write(true).open(spare).map_err(io("open the spare"))?;
        file.write_all_at(header, 0).and_then(|()| file.sync_data()).map_err(io("write the spare's header"))?;
        Ok(HeaderSynced(file))
    }

    fn rename(self, spare: &Path, path: &Path) -> Result<File, StoreError> {
        std::fs::rename(spare, path).map_err(io("reuse the spare"))?;
        Ok(self.0)
    }
}

/// The log file being appended to.
pub(crate) struct Wal {
    dir: PathBuf,
    file: File,
    seq: u64,
    /// Offset of the end of the last record known durable (or of the header).
    durable_len: u64,
}

impl Wal {
    /// Creates log file `seq` (it must not exist), reusing the spare if there is one, writes its header and
    /// makes its name durable.
    pub(crate) fn create(dir: &Path, seq: u64) -> Result<Wal, StoreError> {
        std::fs::create_dir_all(dir).map_err(io("create directory"))?;
        let path = dir.join(file_name(seq));
        let spare = dir.join(SPARE);
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&seq.to_le_bytes());
        let file = if spare.exists() && !path.exists() {
            HeaderSynced::write(&spare, &header)?.rename(&spare, &path)?
        } else {
            let file = OpenOptions::new().create_new(true).write(true).open(&path).map_err(io("create"))?;
            // A new file holds nothing else: the header is made durable by the first append's `sync_data`,
            // and until then a crash leaves a file that replays empty.
            file.write_all_at(&header, 0).map_err(io("write the header"))?;
            file
        };
        // The name must be durable before anything written under it is acknowledged.
        sync_dir(dir)?;
        Ok(Wal { dir: dir.to_path_buf(), file, seq, durable_len: FILE_HEADER })
    }

    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// Bytes of records in the file.
    pub(crate) fn len(&self) -> u64 {
        self.durable_len - FILE_HEADER
    }

    /// Appends `bytes` (whole records) and syncs them. On failure, whatever part of them reached the file is
    /// cut off again, so that a later record is never hidden behind a torn one; if even that fails, the log is
    /// no longer trustworthy and the error says so (the writer then refuses every write until a restart).
    pub(crate) fn append(&mut self, bytes: &[u8]) -> Result<(), AppendError> {
        match self.file.write_all_at(bytes, self.durable_len).and_then(|()| self.file.sync_data()) {
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

    /// Cuts the file after the last durable record: whatever a failed write left, and a reused file's old
    /// records with it, so that no later record is ever read after a torn one.
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
        let written = self.file.write_all_at(&zeros, self.durable_len).and_then(|()| self.file.sync_data());
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

    /// Log file `seq`, created under `dir`, with `records` appended, each one record of [`sample`].
    fn wal_with(dir: &Path, seq: u64, records: usize) -> (Wal, Vec<u8>) {
        let mut wal = Wal::create(dir, seq).unwrap();
        let mut record = Vec::new();
        encode(sample().iter(), seq, &mut record).unwrap();
        for _ in 0..records {
            wal.append(&record).unwrap();
        }
        (wal, record)
    }

    #[test]
    fn records_replay_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), 7).unwrap();
        let mut bytes = Vec::new();
        encode(sample().iter(), 7, &mut bytes).unwrap();
        encode(sample()[..1].iter(), 7, &mut bytes).unwrap();
        wal.append(&bytes).unwrap();
        assert_eq!(wal.len(), bytes.len() as u64);
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
        let (_, record) = wal_with(dir.path(), 9, 1);
        let path = dir.path().join(file_name(9));
        std::fs::write(&path, [vec![0u8; FILE_HEADER as usize], record].concat()).unwrap();
        assert_eq!(replayed(&path, 9).0.records, 0);
    }

    #[test]
    fn a_reused_file_replays_only_what_was_written_since() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = wal_with(dir.path(), 3, 3);
        let old_len = std::fs::metadata(dir.path().join(file_name(3))).unwrap().len();
        drop(wal);
        retire(dir.path(), 4).unwrap();
        remove_retired(dir.path()).unwrap();
        assert!(dir.path().join(SPARE).exists(), "the covered file is kept as the spare");

        let mut wal = Wal::create(dir.path(), 4).unwrap();
        assert!(!dir.path().join(SPARE).exists());
        let path = dir.path().join(file_name(4));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), old_len, "the file is overwritten, not regrown");
        // Before anything is appended, the file's old records are not this file's.
        assert_eq!(replayed(&path, 4).0.records, 0);
        let mut record = Vec::new();
        encode(sample()[..1].iter(), 4, &mut record).unwrap();
        wal.append(&record).unwrap();
        let (found, seen) = replayed(&path, 4);
        assert_eq!((found.records, found.ops), (1, 1));
        assert!(same(&seen[0], &sample()[..1]));
        assert!(found.discarded > 0, "the old records are still there, and ignored");
    }

    #[test]
    fn a_file_whose_header_names_another_number_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        wal_with(dir.path(), 3, 1);
        let path = dir.path().join(file_name(4));
        std::fs::rename(dir.path().join(file_name(3)), &path).unwrap();
        assert_eq!(replayed(&path, 4).0.records, 0);
    }

    /// The spare says which number it last had, so that numbering after a clean stop (no log file left) goes
    /// on past it: reused under the same number, its old records would pass their checksums again.
    #[test]
    fn the_spare_names_the_number_it_last_had() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(spare_seq(dir.path()).unwrap(), None);
        drop(wal_with(dir.path(), 6, 2));
        retire(dir.path(), 7).unwrap();
        remove_retired(dir.path()).unwrap();
        assert_eq!(spare_seq(dir.path()).unwrap(), Some(6));
        std::fs::write(dir.path().join(SPARE), b"short").unwrap();
        assert_eq!(spare_seq(dir.path()).unwrap(), None);
    }

    #[test]
    fn a_failed_append_is_cut_off_so_the_next_record_follows_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, record) = wal_with(dir.path(), 5, 1);
        // What a failed write leaves: part of a record after the last good one.
        wal.file.write_all_at(&record[..record.len() / 2], wal.durable_len).unwrap();
        wal.cut_back().unwrap();
        wal.append(&record).unwrap();
        assert_eq!(replayed(&dir.path().join(file_name(5)), 5).0, Replayed { records: 2, ops: 6, discarded: 0 });
    }

    #[test]
    fn retired_files_are_never_listed_and_are_removed_later_but_one_spare() {
        let dir = tempfile::tempdir().unwrap();
        for seq in [3, 4, 5] {
            wal_with(dir.path(), seq, 1);
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
        let spare = std::fs::metadata(dir.path().join(SPARE)).unwrap().len();
        assert_eq!(spare, RETIRE_STEP * 2 + 10, "the largest is kept");
    }

    /// Truncation only ever meets files already renamed out of the replay: a log file still named `.wal` is
    /// left whole, since a replay of a shortened file would end at the cut and put back older values.
    #[test]
    fn removing_retired_files_never_shortens_a_file_a_replay_reads() {
        let dir = tempfile::tempdir().unwrap();
        for seq in [1, 2] {
            drop(wal_with(dir.path(), seq, 3));
        }
        let sizes = |d: &Path| list(d).unwrap().into_iter().map(|(_, p)| std::fs::metadata(p).unwrap().len()).collect();
        let before: Vec<u64> = sizes(dir.path());
        remove_retired(dir.path()).unwrap();
        assert_eq!(sizes(dir.path()), before);
        retire(dir.path(), 2).unwrap();
        remove_retired(dir.path()).unwrap();
        assert_eq!(sizes(dir.path()), before[1..].to_vec(), "only the retired file went");
        assert_eq!(replayed(&dir.path().join(file_name(2)), 2).0.records, 3);
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
            Wal::create(dir.path(), seq).unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), b"").unwrap();
        let seqs: Vec<u64> = list(dir.path()).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(seqs, vec![2, 0x11, 0x100]);
        assert!(Wal::create(dir.path(), 2).is_err(), "an existing log file is never reused");
    }
}
