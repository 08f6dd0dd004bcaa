//! Schemathesis, the OpenAPI fuzzer, against `GET /v1/openapi.json` of a real server, with a valid key.
//!
//! It generates requests from the document (valid ones, and invalid ones on purpose: wrong types, missing
//! fields, odd characters in paths and headers) and checks every answer: never a 5xx, a status the document
//! lists for the operation, the content type and the body schema it declares. A failure prints schemathesis'
//! own report, which shows the request to replay it.
//!
//! Schemathesis is a Python tool. It is pinned to [`VERSION`] and installed from PyPI into a virtual
//! environment under the cargo target directory (`target/schemathesis-venv`), reused for as long as its
//! version matches. A new environment is built beside that place and renamed into it, so a run never uses a
//! half-installed one; it is run as `python -m schemathesis.cli`, which keeps working after the rename.
//!
//! The server is seeded first (a succeeded payment, a refunded one, a pending one with a merchant reference,
//! a payout) and the fuzzer gets those identifiers as sample path parameters half of the time, so it reaches
//! refunds and lookups of real records instead of only 404s. The provider notice endpoint is signed by
//! providers, not called with a merchant key; it gets a run of its own without the key. Each run is bounded
//! by [`MAX_EXAMPLES`] per operation. Schemathesis picks a random seed and prints it; set
//! `CAISSE_SCHEMATHESIS_SEED` to replay a run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::json;

use crate::support::{payment_body, payout_body, spawn_app, text};

/// The schemathesis release this test installs.
const VERSION: &str = "4.32.5";
const CHECKS: &str = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance";
/// Test cases per operation and phase: about 800 cases for the merchant API, 15–30 s on two cores.
const MAX_EXAMPLES: u32 = 30;
const NOTICES: &str = "/v1/fournisseurs/{code}/notifications";

#[actix_web::test]
async fn schemathesis_finds_no_server_error_and_no_answer_outside_the_document() {
    let venv = blocking(install_schemathesis).await;
    let app = spawn_app().await;

    // Records for the fuzzer to find: succeeded, refunded (in part), pending, and a payout.
    let paid = text(&app.fund(50_000).await["reference"]).to_owned();
    let refunded = text(&app.fund(50_000).await["reference"]).to_owned();
    let resp = app.send(app.post(&format!("/v1/paiement/{refunded}/rembourser")).json(&json!({"montant": 1000}))).await;
    resp.expect(200);
    let refund = text(&resp.json["remboursement"]["reference"]).to_owned();
    let mut pending = payment_body(1000, "02");
    pending["reference"] = json!("commande-42");
    let pending = text(&app.initiate(&pending).await["reference"]).to_owned();
    let resp = app.send(app.post("/v1/retraits").json(&payout_body(1000, "99"))).await;
    resp.expect(201);
    let payout = text(&resp.json["id"]).to_owned();
    let tx = text(&app.get_ok(&format!("/v1/paiement/{paid}")).await["transaction_id"]).to_owned();

    let work = tempfile::TempDir::new().expect("temp dir");
    let config = work.path().join("schemathesis.toml");
    let quoted = |values: &[&str]| values.iter().map(|v| format!("\"{v}\"")).collect::<Vec<_>>().join(", ");
    let toml = format!(
        "[dictionaries.references]\nvalues = [{}]\n\n[dictionaries.payouts]\nvalues = [{}]\n\n\
         [dictionaries.providers]\nvalues = [{}]\n\n[parameters]\n\
         \"path.reference\" = {{ dictionary = \"references\", probability = 0.5 }}\n\
         \"path.id\" = {{ dictionary = \"payouts\", probability = 0.5 }}\n\
         \"path.code\" = {{ dictionary = \"providers\", probability = 0.5 }}\n",
        quoted(&[&paid, &refunded, &refund, &pending, &payout, &tx]),
        quoted(&[&payout]),
        quoted(&["mtn_momo", "orange_money", "moov_money", "wave", "carte"]),
    );
    std::fs::write(&config, toml).expect("schemathesis.toml written");

    let document = format!("{}/v1/openapi.json", app.address);
    let common = |extra: &[&str]| -> Vec<String> {
        let mut args =
            vec!["--config-file".to_owned(), config.display().to_string(), "run".to_owned(), document.clone()];
        args.extend(
            ["--checks", CHECKS, "--max-examples", &MAX_EXAMPLES.to_string(), "--request-timeout", "10"]
                .map(String::from),
        );
        if let Ok(seed) = std::env::var("CAISSE_SCHEMATHESIS_SEED") {
            args.extend(["--seed".to_owned(), seed]);
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };

    // The merchant API, with the demo merchant's key.
    let authorization = format!("Authorization: Bearer {}", app.key);
    let args = common(&["-H", &authorization, "--exclude-path", NOTICES]);
    let (venv_a, dir) = (venv.clone(), work.path().to_owned());
    let merchant_api = blocking(move || schemathesis(&venv_a, &dir, &args)).await;
    let cases = verdict("the merchant API", &merchant_api);
    // Twelve operations: far fewer cases means the document or the filters stopped it from testing them.
    assert!(cases >= 300, "only {cases} cases for the merchant API:\n{}", shown(&merchant_api));

    // The provider notice endpoint, as anybody on the internet would call it: no key, no valid signature.
    let args = common(&["--include-path", NOTICES]);
    let dir = work.path().to_owned();
    let notices = blocking(move || schemathesis(&venv, &dir, &args)).await;
    let cases = verdict("the provider notice endpoint", &notices);
    assert!(cases >= 20, "only {cases} cases for the notice endpoint:\n{}", shown(&notices));

    // Whatever it sent, the server still answers and nothing reached a merchant's money by a forged notice.
    app.get_ok("/v1/soldes").await;
}

/// Runs a blocking step (a process, an installation) off the test's runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    actix_web::rt::task::spawn_blocking(f).await.expect("blocking step finished")
}

/// `<target>/schemathesis-venv`, beside the `<target>/<profile>` directory that holds the binary under test.
fn venv_dir() -> PathBuf {
    let binary = Path::new(env!("CARGO_BIN_EXE_caisse"));
    let target = binary.parent().and_then(Path::parent).expect("the binary lives under the target directory");
    target.join("schemathesis-venv")
}

fn python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

fn installed_version(venv: &Path) -> Option<String> {
    let script = "import importlib.metadata as m; print(m.version('schemathesis'))";
    let out = Command::new(python(venv)).args(["-c", script]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The virtual environment with schemathesis [`VERSION`], installed from PyPI when missing or another version.
fn install_schemathesis() -> PathBuf {
    let venv = venv_dir();
    if installed_version(&venv).as_deref() == Some(VERSION) {
        return venv;
    }
    let staging = venv.with_file_name(format!("schemathesis-venv.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let step = |command: &mut Command, what: &str| {
        let out = command.output().unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
        assert!(out.status.success(), "{what} failed:\n{}", shown(&out));
    };
    step(
        Command::new("python3").arg("-m").arg("venv").arg(&staging),
        "python3 -m venv (Debian needs the python3-venv package; .ci/run installs it)",
    );
    step(
        Command::new(python(&staging)).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            &format!("schemathesis=={VERSION}"),
        ]),
        "pip install schemathesis (needs PyPI)",
    );
    let _ = std::fs::remove_dir_all(&venv);
    if std::fs::rename(&staging, &venv).is_err() {
        // Another test run put its environment there first; it is checked below like ours would be.
        let _ = std::fs::remove_dir_all(&staging);
    }
    assert_eq!(installed_version(&venv).as_deref(), Some(VERSION), "schemathesis in {}", venv.display());
    venv
}

/// Runs schemathesis in `dir`, where it may leave its caches, without colours.
fn schemathesis(venv: &Path, dir: &Path, args: &[String]) -> Output {
    Command::new(python(venv))
        .args(["-m", "schemathesis.cli"])
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("schemathesis runs")
}

fn shown(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Fails with schemathesis' report unless it passed; returns the number of test cases it generated.
#[track_caller]
fn verdict(what: &str, out: &Output) -> u64 {
    let report = shown(out);
    assert!(out.status.success(), "schemathesis found problems in {what}:\n{report}");
    let summary = report.lines().skip_while(|l| l.trim() != "Test cases:").nth(1).unwrap_or("");
    let cases = summary.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let seed = report.lines().find(|l| l.starts_with("Seed:")).unwrap_or("Seed: ?");
    println!("schemathesis {VERSION}, {what}: {} ({seed})", summary.trim());
    cases
}
