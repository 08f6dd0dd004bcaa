//! A data directory laid out by another build is refused before anything reads or writes it, by the real
//! binary, with a message that says what was found and what to do.

use crate::server::run_to_end;

#[test]
fn a_data_directory_of_another_format_is_refused_with_what_to_do() {
    let work = tempfile::tempdir().expect("temp dir");
    let data = work.path().join("data");

    // A directory of a format version this build does not read: the one before it.
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::write(data.join("FORMAT"), "caisse-store 1\n").expect("stamp");
    for args in [&["serve"][..], &["merchant", "create", "--name", "A", "--email", "a@example.com"][..]] {
        let (status, stderr) = run_to_end(work.path(), &data, args);
        assert!(!status.success(), "{args:?} started on format 1");
        assert!(stderr.contains("holds store format 1") && stderr.contains("reads format 6 only"), "{stderr}");
        assert!(stderr.contains("empty data directory"), "{stderr}");
    }
    assert_eq!(std::fs::read_to_string(data.join("FORMAT")).expect("stamp"), "caisse-store 1\n", "left as it was");
    assert!(!data.join("db").exists(), "nothing was written");

    // What the build before format versions left: the store's files and no stamp.
    std::fs::remove_file(data.join("FORMAT")).expect("unstamp");
    std::fs::write(data.join("conf"), "segment_size: 524288\n").expect("sled conf");
    let (status, stderr) = run_to_end(work.path(), &data, &["serve"]);
    assert!(!status.success());
    assert!(stderr.contains("before data directories carried a format version"), "{stderr}");
}
