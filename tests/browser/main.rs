//! The dashboard in a real browser: Debian's `chromium`, headless, driven over WebDriver by `fantoccini`
//! through Debian's `chromedriver`, which the test starts on a free port and stops at the end.
//!
//! One scenario, as a merchant would go through it: log in, see a sandbox payment made through the API
//! appear on the transactions page, set the Webhook URL and receive the next webhook there, roll the key
//! (through its confirmation) and see the old key refused, then make a delivery fail and resend it. A
//! screenshot of every page visited, at laptop size and then at phone size, is saved under
//! `target/screenshots/` for a reviewer to look at.
//!
//! A third scenario follows a payment link from the merchant's dashboard to a customer's phone and back.
//!
//! Without `/usr/bin/chromedriver` the test fails and says how to install it: a browser test that passes
//! without a browser would prove nothing. `.ci/run` installs both packages.

#[path = "../support/mod.rs"]
mod support;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use caisse_engine::domain::records::DeliveryState;
use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use support::{always, free_port, payout_body, reference_of, spawn_app, text, until, Receiver, TestApp, DEADLINE};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const LAPTOP: (u32, u32) = (1280, 900);
const PHONE: (u32, u32) = (390, 844);
/// The narrowest phones still sold in the region.
const SMALL_PHONE: (u32, u32) = (320, 640);

/// The running chromedriver; killed when dropped, whatever happened to the test.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start() -> Driver {
        assert!(
            Path::new(CHROMEDRIVER).exists(),
            "{CHROMEDRIVER} is missing: the browser tests need Debian's chromium and chromium-driver \
             (apt-get install -y chromium chromium-driver; .ci/run installs them)"
        );
        assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing: apt-get install -y chromium");
        let port = free_port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = Driver { child, port };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "chromedriver did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        driver
    }
}

/// Where screenshots go: `target/screenshots/` of the workspace (or of `CARGO_TARGET_DIR`).
fn screenshot_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.parent().unwrap_or(tmp).join("screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot directory");
    dir
}

struct Browser {
    client: Client,
    base: String,
    shots: PathBuf,
}

impl Browser {
    async fn open(driver: &Driver, base: &str, profile: &Path) -> Browser {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--no-first-run", format!("--user-data-dir={}", profile.display()),
                    format!("--window-size={},{}", LAPTOP.0, LAPTOP.1),
                ],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", driver.port))
            .await
            .expect("a chromium session");
        Browser { client, base: base.to_owned(), shots: screenshot_dir() }
    }

    async fn goto(&self, path: &str) {
        self.client.goto(&format!("{}{}", self.base, path)).await.expect("navigation");
    }

    async fn path(&self) -> String {
        let url = self.client.current_url().await.expect("current url");
        match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// The element's text. A click that navigates leaves the old page in place for a moment, so an element
    /// found there can go stale before it is read: such reads are tried again.
    async fn text(&self, css: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let element = self.client.wait().for_element(Locator::Css(css)).await.expect(css);
            match element.text().await {
                Ok(text) => return text,
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("reading {css} again: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("reading {css}: {e}"),
            }
        }
    }

    /// Waits (up to 10 s) until the element's text satisfies `ok`, which covers the moment after a click when
    /// the previous page is still shown; panics with the last text seen otherwise.
    async fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let text = self.text(css).await;
            if ok(&text) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{css} never showed {what:?}; last text: {text:?}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    async fn shows(&self, css: &str, needle: &str) {
        self.wait_text(css, needle, |t| t.contains(needle)).await;
    }

    async fn shows_exactly(&self, css: &str, expected: &str) {
        self.wait_text(css, expected, |t| t == expected).await;
    }

    /// Clicks the element, finding it again if it went stale before the click (nothing was clicked then).
    async fn click(&self, css: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let element = self.client.wait().for_element(Locator::Css(css)).await.expect(css);
            match element.click().await {
                Ok(()) => return,
                Err(e) if std::time::Instant::now() < deadline && e.to_string().contains("stale") => {
                    eprintln!("clicking {css} again: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("clicking {css}: {e}"),
            }
        }
    }

    async fn fill(&self, css: &str, value: &str) {
        let field = self.client.wait().for_element(Locator::Css(css)).await.expect(css);
        field.clear().await.expect("clear");
        field.send_keys(value).await.expect("type");
    }

    async fn source(&self) -> String {
        self.client.source().await.expect("page source")
    }

    async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::write(self.shots.join(format!("{name}.png")), png).expect("screenshot saved");
    }

    /// What on this page a customer on a small screen or with assistive technology would trip on: text whose
    /// contrast with its background is under WCAG's AA ratio (4.5:1, 3:1 for large text), a field without a label,
    /// or a page wider than the window (so it scrolls sideways). Empty when the page is fine.
    async fn accessibility_faults(&self) -> Vec<String> {
        const CHECK: &str = r#"
            const rgba = (text) => {
                const n = (text.match(/[\d.]+/g) || ['0', '0', '0', '0']).map(Number);
                return { r: n[0], g: n[1], b: n[2], a: n.length > 3 ? n[3] : 1 };
            };
            const over = (top, under) => ({
                r: top.r * top.a + under.r * (1 - top.a),
                g: top.g * top.a + under.g * (1 - top.a),
                b: top.b * top.a + under.b * (1 - top.a),
                a: 1,
            });
            const background = (element) => {
                const layers = [];
                for (let e = element; e; e = e.parentElement) layers.push(rgba(getComputedStyle(e).backgroundColor));
                return layers.reverse().reduce((under, top) => over(top, under), { r: 255, g: 255, b: 255, a: 1 });
            };
            const luminance = (c) => {
                const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b);
            };
            const faults = [];
            for (const e of document.querySelectorAll('body *')) {
                const own = [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
                const shown = e.checkVisibility({ opacityProperty: true, visibilityProperty: true });
                if (!own || !shown) continue;
                const style = getComputedStyle(e);
                const back = background(e);
                const fore = over(rgba(style.color), back);
                const [hi, lo] = [luminance(fore), luminance(back)].sort((x, y) => y - x);
                const ratio = (hi + 0.05) / (lo + 0.05);
                const size = parseFloat(style.fontSize);
                const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
                const text = e.textContent.trim().slice(0, 40);
                if (ratio < (large ? 3 : 4.5)) faults.push(`contrast ${ratio.toFixed(2)}: ${e.tagName} "${text}"`);
            }
            for (const f of document.querySelectorAll('input:not([type=hidden]), select, textarea')) {
                if (!f.labels || f.labels.length === 0) faults.push(`no label: ${f.id || f.name}`);
            }
            const [wide, room] = [document.documentElement.scrollWidth, document.documentElement.clientWidth];
            if (wide > room) faults.push(`${wide} px wide in a window of ${room} px`);
            return faults;
        "#;
        let faults = self.client.execute(CHECK, vec![]).await.expect("the accessibility check runs");
        serde_json::from_value(faults).expect("a list of faults")
    }

    /// The page's viewport is `width` CSS pixels wide: a window Chromium refused to make that narrow would
    /// let a check meant for a small phone pass at a wider size.
    async fn assert_width(&self, width: u32) {
        let inner = self.client.execute("return window.innerWidth;", vec![]).await.expect("the window's width");
        assert_eq!(inner.as_u64(), Some(u64::from(width)), "the viewport's width");
    }

    async fn assert_accessible(&self, screen: &str) {
        let faults = self.accessibility_faults().await;
        assert!(faults.is_empty(), "{screen}: {faults:?}");
    }

    /// Where the keyboard's focus goes, Tab after Tab from the top of a freshly loaded page: each focused
    /// element's id, or its tag and text.
    async fn tab_order(&self, steps: usize) -> Vec<String> {
        let tab: char = fantoccini::key::Key::Tab.into();
        let mut order = Vec::with_capacity(steps);
        for _ in 0..steps {
            let press = KeyActions::new("clavier".into())
                .then(KeyAction::Down { value: tab })
                .then(KeyAction::Up { value: tab });
            self.client.perform_actions(press).await.expect("Tab");
            let focused = self
                .client
                .execute(
                    "const e = document.activeElement; \
                     return e.id || (e.tagName.toLowerCase() + ':' + e.textContent.trim());",
                    vec![],
                )
                .await
                .expect("the focused element");
            order.push(focused.as_str().unwrap_or_default().to_owned());
        }
        order
    }

    /// Reloads `path` until its source contains `text`.
    async fn until_shown(&self, path: &str, text: &str) {
        let started = Instant::now();
        loop {
            self.goto(path).await;
            if self.source().await.contains(text) {
                return;
            }
            assert!(started.elapsed() < DEADLINE, "{path} never showed `{text}`");
            actix_web::rt::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn notification_state(app: &TestApp, reference: &str, event: &str) -> Option<(String, DeliveryState)> {
    app.notification(&app.demo.merchant.id, reference, event).map(|n| (n.id, n.state))
}

#[actix_web::test]
async fn a_merchant_goes_through_the_dashboard_in_chromium() {
    let driver = Driver::start();
    let profile = tempfile::TempDir::new().expect("profile dir");
    let app = spawn_app().await;
    let receiver = Receiver::start(always(200));
    let browser = Browser::open(&driver, &app.address, profile.path()).await;
    let old_key = app.demo.merchant.secret_key.clone();

    log_in(&browser, &app).await;
    let reference = a_sandbox_payment_appears_and_succeeds(&browser, &app).await;
    set_the_webhook_url(&browser, &app, &receiver).await;
    let new_key = roll_the_key(&browser, &app, &old_key).await;
    resend_a_failed_delivery(&browser, &app, &receiver, &new_key).await;

    // A payout, for the payouts page.
    let payout = app.with_key(&new_key).payout(&payout_body(1000, "99")).await;
    browser.click("nav a[href='/payouts']").await;
    browser.until_shown("/payouts", text(&payout["id"])).await;
    browser.shot("11-payouts").await;

    the_same_pages_on_a_phone(&browser, &reference).await;

    // Log out: the session is gone.
    browser.click("form.logout button").await;
    browser.text("#email").await;
    assert_eq!(browser.path().await, "/login");
    browser.goto("/").await;
    assert_eq!(browser.path().await, "/login");
    browser.client.close().await.expect("session closed");
    drop(driver);
}

/// The merchant's own actions, in the browser: a partial refund and a payout, each through its confirmation
/// page; a test event received by a local receiver; the replay of today's notifications, every one of them
/// delivered again. Screenshots of each page at laptop and phone size.
#[actix_web::test]
async fn a_merchant_refunds_pays_out_and_checks_its_receiver_in_chromium() {
    let driver = Driver::start();
    let profile = tempfile::TempDir::new().expect("profile dir");
    let app = spawn_app().await;
    let receiver = Receiver::start(always(200));
    let browser = Browser::open(&driver, &app.address, profile.path()).await;
    log_in(&browser, &app).await;
    let reference = reference_of(&app.pay(20_000, "99").await);
    app.pay(10_000, "99").await;
    app.wait_payment(&reference, "succes").await;

    // A refund of 5 000 from the payment's page, through its confirmation.
    browser.goto(&format!("/transactions/{reference}")).await;
    browser.shows("#refund", "Reste à rembourser").await;
    browser.fill("#montant", "5000").await;
    browser.fill("#motif", "article retourné").await;
    browser.shot("21-refund-form").await;
    browser.click("#refund button[type=submit]").await;
    browser.shows_exactly("h1", "Confirmer le remboursement").await;
    browser.shot("22-refund-review").await;
    browser.click("button.primary").await;
    app.wait_payment(&reference, "rembourse_partiellement").await;
    browser.until_shown(&format!("/transactions/{reference}"), "rembourse_partiellement").await;
    browser.shows("main", "article retourné").await;
    browser.shot("23-refund-done").await;

    // A payout from the payouts page, through its confirmation.
    browser.click("nav a[href='/payouts']").await;
    browser.click("a[href='/payouts/new']").await;
    browser.fill("#montant", "3000").await;
    browser.click("#devise option[value='XOF']").await;
    browser.click("#fournisseur option[value='mtn_momo']").await;
    browser.fill("#beneficiaire_telephone", "+229 96 00 00 99").await;
    browser.fill("#reference", "paie-novembre").await;
    browser.shot("24-payout-form").await;
    browser.click("form.payout button[type=submit]").await;
    browser.shows_exactly("h1", "Confirmer le retrait").await;
    browser.shot("25-payout-review").await;
    browser.click("button.primary").await;
    browser.shows("main", "paie-novembre").await;
    browser.shot("26-payout-done").await;
    browser.until_shown("/payouts", "paie-novembre").await;
    let payouts = app.get_ok("/v1/retraits").await;
    assert_eq!(payouts["data"].as_array().map(Vec::len), Some(1), "{payouts}");

    // The receiver: saved, tested, then today's notifications replayed.
    browser.goto("/keys").await;
    browser.fill("#webhook_url", &receiver.url()).await;
    browser.click("#save-webhook").await;
    browser.shows("p.alert.ok", "Webhook URL enregistrée.").await;
    browser.click("nav a[href='/webhooks']").await;
    browser.click("#tools form.inline button").await;
    browser.shows("#attempt", "200").await;
    browser.shot("27-webhook-test").await;
    let test_hit = receiver.hits().into_iter().find(|h| h.event() == "webhook.test").expect("the test event");
    assert!(test_hit.signed_with(&app.key));
    let merchant = app.demo.merchant.id.clone();
    let stored = app.notifications(&merchant);
    browser.click("nav a[href='/webhooks']").await;
    let today = caisse_engine::domain::time::Timestamp::now().to_rfc3339()[..10].to_owned();
    // Typed as the date picker of the browser's locale expects is brittle; the field takes the ISO value.
    browser.client.execute(
        "document.getElementById('replay-du').value = arguments[0]; document.getElementById('replay-au').value = arguments[0];",
        vec![json!(today)],
    ).await.expect("dates set");
    browser.click("#tools form.filters button").await;
    browser.shows("main", "Renvoi du").await;
    until("every notification of the day delivered again", || async {
        app.notifications(&merchant).iter().filter(|n| n.total_attempts >= 2).count() == stored.len()
    })
    .await;
    browser.until_shown("/webhooks/replay", &format!("data-delivered=\"{}\"", stored.len())).await;
    browser.shot("28-webhook-replay").await;
    for n in &stored {
        assert!(
            receiver.hits().iter().any(|h| h.webhook_id() == n.id && h.signed_with(&app.key)),
            "{} delivered",
            n.id
        );
    }

    browser.client.set_window_size(PHONE.0, PHONE.1).await.expect("phone size");
    for (path, name) in [
        (format!("/transactions/{reference}"), "phone-21-refund-form"),
        ("/payouts/new".to_owned(), "phone-24-payout-form"),
        ("/payouts".to_owned(), "phone-26-payouts"),
        ("/webhooks/replay".to_owned(), "phone-28-webhook-replay"),
    ] {
        browser.goto(&path).await;
        browser.shot(name).await;
    }
    browser.client.close().await.expect("session closed");
    drop(driver);
}

/// A payment link, from the merchant's dashboard to a customer's phone: the merchant creates it and sees its
/// QR code; the customer opens it at 390 px, is declined with a number ending in 01, tries again and ends on
/// the receipt; a double tap makes one payment; the paid link then answers 410; the merchant sees the payment
/// with `metadata.lien_id`. Screenshots of each screen (the customer's at phone size).
#[actix_web::test]
async fn a_customer_pays_a_payment_link_on_a_phone_in_chromium() {
    let driver = Driver::start();
    let profile = tempfile::TempDir::new().expect("profile dir");
    let app = spawn_app().await;
    let browser = Browser::open(&driver, &app.address, profile.path()).await;
    log_in(&browser, &app).await;

    // The merchant makes a one-time link of 5 000 FCFA for two fournisseurs.
    browser.click("nav a[href='/links']").await;
    browser.click("a[href='/links/new']").await;
    browser.fill("#description", "Frais de scolarité, 1er trimestre").await;
    browser.fill("#montant", "5000").await;
    browser.click("input[name=fournisseurs][value=mtn_momo]").await;
    browser.click("input[name=fournisseurs][value=moov_money]").await;
    browser.shot("31-link-form").await;
    browser.click("form.card button[type=submit]").await;
    browser.shows("#partage", "Adresse du lien").await;
    browser.shot("32-link-detail").await;
    let links = app.get_ok("/v1/liens").await;
    let link = links["data"][0].clone();
    let id = text(&link["id"]).to_owned();
    let url = text(&link["url"]).to_owned();
    assert!(browser.source().await.contains(&url));
    browser.goto("/links").await;
    browser.shows("#links", "Frais de scolarité").await;
    browser.shot("33-links").await;

    // The form on the narrowest phone: one column, nothing wider than the screen, readable.
    browser.client.set_window_size(SMALL_PHONE.0, SMALL_PHONE.1).await.expect("small phone size");
    browser.client.goto(&url).await.expect("the link opens");
    browser.shows("p.amount", "5 000 FCFA").await;
    browser.assert_width(SMALL_PHONE.0).await;
    browser.assert_accessible("the form at 320 px").await;
    browser.shot("40-payer-form-320").await;

    // The customer, on a phone: the form, a declined number, the failure, a retry that succeeds.
    browser.client.set_window_size(PHONE.0, PHONE.1).await.expect("phone size");
    browser.client.goto(&url).await.expect("the link opens");
    browser.shows("p.amount", "5 000 FCFA").await;
    browser.assert_accessible("the form").await;
    let order = browser.tab_order(6).await;
    assert_eq!(
        order,
        ["fournisseur", "pays", "telephone", "nom", "email", "button:Payer 5 000 FCFA"],
        "the keyboard goes through the form in reading order"
    );
    browser.shot("41-payer-form").await;
    browser.click("#fournisseur option[value='mtn_momo']").await;
    browser.click("#pays option[value='BJ']").await;
    browser.fill("#telephone", "97 00 00 01").await;
    browser.click("button[type=submit]").await;
    browser.shows("h1", "Validez le paiement").await;
    browser.assert_accessible("the waiting screen").await;
    browser.shot("42-payer-waiting").await;
    browser.shows("h1", "Paiement refusé").await; // the page refreshes itself, no script
    browser.assert_accessible("the failure").await;
    browser.shot("43-payer-declined").await;
    browser.click("a.button").await;
    browser.click("#fournisseur option[value='mtn_momo']").await;
    browser.click("#pays option[value='BJ']").await;
    browser.fill("#telephone", "+229 97 00 00 55").await;
    // The same form sent twice at once with this browser's cookie, as two taps whose posts both reach the
    // server, then tapped twice more in the browser: one payment comes of all four.
    let form = browser.source().await;
    let token = form
        .split("name=\"jeton\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the form's token")
        .to_owned();
    let cookie = browser.client.get_named_cookie("caisse_payer").await.expect("the page's cookie");
    let cookie = format!("caisse_payer={}", cookie.value());
    let phone = "+229 97 00 00 55";
    let fields = [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", phone)];
    let post = || {
        let form = serde_urlencoded::to_string(fields).expect("a form");
        let req = app.post(&format!("/payer/{id}")).no_auth().header("cookie", &cookie);
        let client = support::Api { client: awc::Client::builder().disable_redirects().finish(), ..app.api.clone() };
        async move { client.fetch(req.raw(Some("application/x-www-form-urlencoded"), form)).await }
    };
    let (first, second) = futures_util::future::join(post(), post()).await;
    assert_eq!((first.status, second.status), (303, 303));
    assert_eq!(first.header("location"), second.header("location"), "both posts land on one payment");
    browser
        .client
        .execute("const b = document.querySelector('button[type=submit]'); b.click(); b.click();", vec![])
        .await
        .expect("double tap");
    browser.shows("h1", "Paiement réussi").await;
    assert_eq!(
        Some(browser.path().await.as_str()),
        first.header("location"),
        "the browser's taps land on the payment the two posts made"
    );
    browser.assert_accessible("the receipt").await;
    browser.shot("44-payer-receipt").await;
    browser.client.set_window_size(SMALL_PHONE.0, SMALL_PHONE.1).await.expect("small phone size");
    browser.assert_width(SMALL_PHONE.0).await;
    browser.assert_accessible("the receipt at 320 px").await;
    browser.shot("48-payer-receipt-320").await;
    browser.client.set_window_size(PHONE.0, PHONE.1).await.expect("phone size");
    let payments = app.list_all("/v1/transactions?type=paiement", 100).await;
    let paid: Vec<_> = payments.iter().filter(|p| p["statut"] == "succes").collect();
    assert_eq!((payments.len(), paid.len()), (2, 1), "one declined, one paid: {payments:?}");
    let reference = text(&paid[0]["reference"]).to_owned();

    // The paid one-time link is closed.
    browser.client.goto(&url).await.expect("the link opens");
    browser.shows("h1", "Paiement impossible").await;
    browser.shows("main", "déjà été payé").await;
    browser.assert_accessible("the paid link").await;
    browser.shot("45-payer-paid-link").await;

    // The merchant sees the payment, with the link's id in its metadata, and the link paid.
    browser.client.set_window_size(LAPTOP.0, LAPTOP.1).await.expect("laptop size");
    browser.goto(&format!("/transactions/{reference}")).await;
    browser.shows("main", &format!("\"lien_id\":\"{id}\"")).await;
    browser.shot("46-link-payment-in-dashboard").await;
    browser.goto(&format!("/links/{id}")).await;
    browser.shows("main", "paye").await;
    browser.shows("#link-payments", &reference).await;
    browser.shot("47-link-paid").await;
    browser.client.close().await.expect("session closed");
    drop(driver);
}

/// A payment that needs the customer's browser: a link paid through Wave (the local fake) in Chromium, from the
/// link's page to Wave's page, then back through Caisse's return page to the link's receipt.
#[actix_web::test]
async fn a_customer_pays_through_waves_page_and_comes_back_in_chromium() {
    let driver = Driver::start();
    let profile = tempfile::TempDir::new().expect("profile dir");
    let port = free_port();
    let webhook_url = format!("http://127.0.0.1:{port}/v1/notifications/wave");
    let fake = support::Fake::start(&["wave", "--listen", "127.0.0.1:0", "--webhook-url", &webhook_url]);
    let base_url = fake.base.clone();
    let app = support::spawn_app_with(move |s| {
        s.listen = format!("127.0.0.1:{port}").parse().expect("a loopback address");
        s.public_url = format!("http://127.0.0.1:{port}");
        s.adapters.wave = Some(caisse::config::WaveSettings {
            base_url,
            api_key: caisse::config::Secret::new("wave_sn_prod_fake-api-key".into()),
            webhook_secret: Some(caisse::config::Secret::new("wave_sn_WHS_fake-webhook-secret".into())),
        });
        for p in &mut s.providers {
            if p.code.as_str() == "wave" {
                p.adapter = Some("wave".into());
            }
        }
    })
    .await;
    let link = app
        .send(app.post("/v1/liens").json(
            &json!({"montant": 2500, "devise": "XOF", "description": "Panier du marché", "fournisseurs": ["wave"]}),
        ))
        .await;
    link.expect(201);
    let url = text(&link.json["url"]).to_owned();
    let browser = Browser::open(&driver, &app.address, profile.path()).await;
    browser.client.set_window_size(PHONE.0, PHONE.1).await.expect("phone size");
    browser.client.goto(&url).await.expect("the link opens");
    browser.click("#pays option[value='SN']").await;
    browser.fill("#telephone", "77 000 00 55").await;
    browser.shot("51-wave-link-form").await;
    browser.click("button[type=submit]").await;
    // Wave's page (the fake's), where the customer approves.
    browser.shows("h1", "Payer 2500 XOF").await;
    assert!(browser.client.current_url().await.expect("url").as_str().starts_with(&fake.base));
    browser.shot("52-wave-page").await;
    // The link's own page for this payment, if the customer comes back to it before paying, says to finish at
    // Wave and leads there again.
    let started = app.list_all("/v1/transactions?type=paiement", 10).await;
    let route = app.state.engine.route_of(text(&started[0]["transaction_id"])).expect("the route").expect("kept");
    let page = route.return_url.expect("the payment's page").as_str().to_owned();
    assert!(page.starts_with(&format!("{}/payer/{}/", app.address, text(&link.json["id"]))), "{page}");
    browser.client.goto(&page).await.expect("the payment's page opens");
    browser.shows("h1", "Terminez le paiement").await;
    browser.shows("a.button", "Continuer vers Wave").await;
    browser.assert_accessible("the page leading to Wave's").await;
    browser.click("a.button").await;
    browser.shows("h1", "Payer 2500 XOF").await;
    browser.click("#pay").await;
    // Back through /retour to the link's page, which ends on the receipt.
    browser.shows("h1", "Paiement réussi").await;
    assert!(browser.path().await.starts_with(&format!("/payer/{}/", text(&link.json["id"]))));
    browser.shot("53-wave-receipt").await;
    let payments = app.list_all("/v1/transactions?type=paiement", 10).await;
    assert_eq!(payments.len(), 1);
    assert_eq!(payments[0]["statut"], "succes");
    browser.client.close().await.expect("session closed");
    drop(driver);
}

/// The dashboard asks for a login first; a wrong password is refused with a message, the right one opens
/// the overview.
async fn log_in(browser: &Browser, app: &TestApp) {
    browser.goto("/").await;
    assert_eq!(browser.path().await, "/login", "the dashboard asks for a login first");
    browser.shot("01-login").await;
    browser.fill("#email", app.email()).await;
    browser.fill("#password", "wrong password").await;
    browser.click("button[type=submit]").await;
    browser.shows("p.alert.error", "E-mail ou mot de passe incorrect.").await;
    browser.shot("01b-login-wrong-password").await;
    browser.fill("#email", app.email()).await;
    browser.fill("#password", app.password()).await;
    browser.click("button[type=submit]").await;
    browser.shows_exactly("h1", "Vue d'ensemble").await;
    assert_eq!(browser.path().await, "/");
}

/// A sandbox payment made through the API appears, succeeds, opens on its detail and counts in the
/// overview's balance. Returns its reference.
async fn a_sandbox_payment_appears_and_succeeds(browser: &Browser, app: &TestApp) -> String {
    let reference = reference_of(&app.pay(5000, "99").await);
    browser.until_shown("/transactions", &reference).await;
    browser.until_shown("/transactions", "badge ok\">succes").await;
    browser.shows("#transactions", "5 000 XOF").await;
    browser.shot("02-transactions").await;
    browser.click(&format!("a[href='/transactions/{reference}']")).await;
    browser.shows_exactly("h1", &reference).await;
    browser.shows("#history", "Confirmé par le fournisseur").await;
    browser.shot("03-transaction-detail").await;
    browser.goto("/").await;
    browser.shows("main", "4 925 XOF").await;
    browser.shot("04-overview").await;
    reference
}

/// The Webhook URL: a refused value shows why, then the receiver's URL is saved and gets the next webhook.
async fn set_the_webhook_url(browser: &Browser, app: &TestApp, receiver: &Receiver) {
    browser.click("nav a[href='/keys']").await;
    browser.shows_exactly("h1", "API keys").await;
    browser.fill("#webhook_url", "ftp://example.com/hook").await;
    browser.click("#save-webhook").await;
    browser.shows("#webhook_url_error", "https://").await;
    browser.shot("05-keys-webhook-refused").await;
    browser.fill("#webhook_url", &receiver.url()).await;
    browser.click("#save-webhook").await;
    browser.shows("p.alert.ok", "Webhook URL enregistrée.").await;
    browser.shot("06-keys-webhook-saved").await;
    let next = reference_of(&app.pay(1500, "99").await);
    let hit = receiver.wait_for(&next, "payment.succeeded").await;
    assert!(hit.signed_with(&app.key));
}

/// Rolls the key, through the confirmation; the old key is refused by the API from then on. Returns the new
/// key, as the page reveals it.
async fn roll_the_key(browser: &Browser, app: &TestApp, old_key: &str) -> String {
    browser.click("#roll").await;
    browser.shows("main", "l'ancienne cesse de fonctionner immédiatement").await;
    browser.shot("07-roll-confirmation").await;
    browser.click("#confirm-roll").await;
    browser.shows("p.alert.ok", "Nouvelle clé secrète active").await;
    assert!(!browser.source().await.contains(old_key));
    browser.click("#reveal").await;
    let new_key = browser.text("#key-value").await;
    browser.shot("08-keys-rolled-revealed").await;
    assert_ne!(new_key, old_key);
    assert_eq!(new_key, app.demo_merchant().secret_key);
    app.send(app.get("/v1/soldes").auth(old_key)).await.expect(401);
    app.send(app.get("/v1/soldes").auth(&new_key)).await.expect(200);
    new_key
}

/// A delivery that fails (the receiver answers 500 to both attempts), then is resent from the page.
async fn resend_a_failed_delivery(browser: &Browser, app: &TestApp, receiver: &Receiver, key: &str) {
    receiver.answer(500);
    let failing = reference_of(&app.with_key(key).pay(2000, "99").await);
    until("the delivery failed", || async {
        notification_state(app, &failing, "payment.succeeded").is_some_and(|(_, s)| s == DeliveryState::Failed)
    })
    .await;
    let (id, _) = notification_state(app, &failing, "payment.succeeded").expect("notification");
    browser.click("nav a[href='/webhooks']").await;
    let card = format!("#failed article[id='{id}']");
    browser.shows(&card, "500").await;
    browser.shot("09-webhooks-failed").await;
    receiver.answer(200);
    browser.click(&format!("{card} button[type=submit]")).await;
    browser.shows("p.alert.ok", "Notification renvoyée").await;
    receiver.wait_for(&failing, "payment.succeeded").await;
    until("the resent delivery succeeded", || async {
        notification_state(app, &failing, "payment.succeeded").is_some_and(|(_, s)| s == DeliveryState::Delivered)
    })
    .await;
    assert!(receiver.hits().iter().any(|h| h.reference() == failing && h.signed_with(key)));
    browser.until_shown("/webhooks", &format!("id=\"{id}\" data-state=\"delivered\"")).await;
    browser.shot("10-webhooks-resent").await;
}

/// The pages visited, at phone size, for the screenshots.
async fn the_same_pages_on_a_phone(browser: &Browser, reference: &str) {
    browser.client.set_window_size(PHONE.0, PHONE.1).await.expect("phone size");
    for (path, name) in [
        ("/", "phone-01-overview"),
        ("/transactions", "phone-02-transactions"),
        (&format!("/transactions/{reference}") as &str, "phone-03-detail"),
        ("/payouts", "phone-04-payouts"),
        ("/webhooks", "phone-05-webhooks"),
        ("/keys", "phone-06-keys"),
    ] {
        browser.goto(path).await;
        browser.shot(name).await;
    }
    browser.client.set_window_size(LAPTOP.0, LAPTOP.1).await.expect("laptop size");
}
