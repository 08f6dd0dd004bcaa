//! `caisse backup` under load, then `caisse restore`: the restored store passes its audit and holds every
//! payment acknowledged before the backup was asked for.

use std::cell::RefCell;
use std::process::Command;
use std::rc::Rc;

use serde_json::json;

use crate::support::{sleep_ms, spawn_app_with, Api};
use crate::{start, TOKEN};

const BIN: &str = env!("CARGO_BIN_EXE_caisse");

#[actix_web::test]
async fn a_backup_under_load_restores_with_every_acknowledged_payment() {
    let (app, admin) = start().await;
    let work = tempfile::tempdir().expect("work dir");
    let to = work.path().join("backup");
    let acknowledged: Rc<RefCell<Vec<String>>> = Rc::default();
    let load: Vec<_> = (0..4)
        .map(|w| {
            let (api, acknowledged) = (app.api.clone(), acknowledged.clone());
            actix_web::rt::spawn(async move {
                for n in 0..40 {
                    let reference = format!("w{w}-n{n}");
                    let body = json!({"montant": 1_000, "devise": "XOF", "fournisseur": "mtn_momo",
                        "client_telephone": "+22997000000", "reference": reference});
                    if api.send(api.post("/v1/paiement/initier").json(&body)).await.status == 201 {
                        acknowledged.borrow_mut().push(reference);
                    }
                }
            })
        })
        .collect();
    sleep_ms(150).await;
    // Everything acknowledged before the backup is asked for must be in it.
    let before: Vec<String> = acknowledged.borrow().clone();
    let made = admin.fetch(admin.post("/admin/backup").json(&json!({"to": to}))).await;
    made.expect(200);
    assert!(made.json["keys"].as_u64().is_some_and(|k| k > 0), "{}", made.json);
    let unfinished = caisse_engine::store::fjall_store::BACKUP_UNFINISHED;
    assert!(!to.join(unfinished).exists(), "a finished backup carries no mark of an unfinished one");
    for task in load {
        task.await.expect("a load task ends");
    }
    assert!(!before.is_empty(), "the load was running");
    // Bad targets are refused, naming the field.
    let again = admin.fetch(admin.post("/admin/backup").json(&json!({"to": to}))).await;
    again.expect(400);
    assert_eq!(again.json["error"]["field"], "to");
    admin.fetch(admin.post("/admin/backup").json(&json!({"to": "relative/dir"}))).await.expect(400);
    // A target the server cannot write says why, naming it, rather than that the store is unavailable.
    let file = work.path().join("a-file");
    std::fs::write(&file, b"not a directory").expect("a file");
    let unwritable = file.join("backup");
    let refused = admin.fetch(admin.post("/admin/backup").json(&json!({"to": unwritable}))).await;
    refused.expect(400);
    assert_eq!(refused.json["error"]["field"], "to");
    let message = refused.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("could not be written") && message.contains("a-file"), "{message}");

    // A backup cut short (its mark still there) is refused: it may lack whole trees.
    let cut = work.path().join("cut");
    for entry in walk(&to) {
        let target = cut.join(entry.strip_prefix(&to).expect("inside"));
        std::fs::create_dir_all(target.parent().expect("a parent")).expect("dir");
        std::fs::copy(&entry, &target).expect("copy");
    }
    std::fs::write(cut.join(unfinished), b"cut short").expect("mark");
    let refused = Command::new(BIN)
        .args(["restore", "--from"])
        .arg(&cut)
        .env("CAISSE_DATA_DIR", work.path().join("never"))
        .env("CAISSE_MASTER_KEY", caisse::config::TEST_MASTER_KEY)
        .env("CAISSE_LOG", "warn")
        .env_remove("CAISSE_ADMIN_TOKEN")
        .output()
        .expect("caisse restore runs");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not finished"), "{refused:?}");
    let opened = caisse_engine::store::open_embedded(&cut, 1 << 20, None).map(drop);
    assert!(opened.is_err_and(|e| e.to_string().contains("not finished")), "no server starts on it");

    // Restore into a new data directory with the command, as an operator would: first with another master key,
    // which is refused and leaves the directory as it found it, so the restore can be run again.
    let restored = work.path().join("restored");
    let wrong_key = Command::new(BIN)
        .args(["restore", "--from"])
        .arg(&to)
        .env("CAISSE_DATA_DIR", &restored)
        .env("CAISSE_MASTER_KEY", "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=")
        .env("CAISSE_LOG", "warn")
        .env_remove("CAISSE_ADMIN_TOKEN")
        .output()
        .expect("caisse restore runs");
    assert!(!wrong_key.status.success());
    assert!(String::from_utf8_lossy(&wrong_key.stderr).contains("does not open with this master key"));
    assert!(std::fs::read_dir(&restored).is_ok_and(|mut entries| entries.next().is_none()), "left empty");
    let output = Command::new(BIN)
        .args(["restore", "--from"])
        .arg(&to)
        .env("CAISSE_DATA_DIR", &restored)
        .env("CAISSE_MASTER_KEY", caisse::config::TEST_MASTER_KEY)
        .env("CAISSE_LOG", "warn")
        .env_remove("CAISSE_ADMIN_TOKEN")
        .output()
        .expect("caisse restore runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("\"audit\":\"passed\""));
    let into_full = Command::new(BIN)
        .args(["restore", "--from"])
        .arg(&to)
        .env("CAISSE_DATA_DIR", &restored)
        .output()
        .expect("caisse restore runs");
    assert!(!into_full.status.success(), "never over a store");

    // A server on the restored store (its start audits it) holds every payment acknowledged before.
    let key = app.demo.merchant.secret_key.clone();
    let data = restored.clone();
    let copy = spawn_app_with(move |s| {
        s.data_dir = data;
        s.admin_token = Some(caisse::config::Secret::new(TOKEN.into()));
    })
    .await;
    let api = Api::new(&copy.address, &key);
    for reference in &before {
        api.send(api.get(&format!("/v1/paiement/{reference}"))).await.expect(200);
    }
    println!("backup: {} payments acknowledged before it, all restored; {}", before.len(), made.json);
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read a directory").flatten() {
        match entry.path().is_dir() {
            true => files.extend(walk(&entry.path())),
            false => files.push(entry.path()),
        }
    }
    files
}
