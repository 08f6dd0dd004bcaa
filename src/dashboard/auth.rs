//! Who is looking at the dashboard: login with e-mail and password, logout, server-side sessions, CSRF
//! tokens and the throttling of failed logins (docs/api.md § Dashboard and operator commands).
//!
//! Sessions live in memory: the cookie `caisse_session` carries only a random id (190 bits from the OS
//! generator), the server keeps the merchant, the session's CSRF token and its times under the SHA-256 of that
//! id, so a memory dump or a timing probe of the map never yields a usable cookie. A session ends after
//! [`SESSION_IDLE`] without a request, after [`SESSION_MAX_AGE`] whatever happens, or at logout. The map holds
//! at most [`MAX_SESSIONS`]; when full, expired sessions go first, then the least recently used one. A restart
//! logs everybody out, which is the price of keeping no session on disk. The nodes of a cluster keep them in
//! the shared database instead, under the same digest (`caisse_engine::cluster::SharedSessions`): a session
//! opened on one node is valid on all, and one ended anywhere (a logout, a suspension) is ended everywhere.
//!
//! Every form carries its session's token in a hidden field, compared in constant time before any POST does
//! anything. The login form has no session yet, so it uses a double-submit token: the same random value in a
//! `SameSite=Strict` cookie and in the form, which another site can neither read nor set.
//!
//! Login attempts are counted before the password is checked, per (account, address) pair ([`MAX_FAILURES`]
//! in [`FAILURE_WINDOW`]: what locks an attacker out while the merchant, from its own address, still logs
//! in), per address ([`MAX_ADDRESS_ATTEMPTS`]) and per account from all addresses ([`MAX_ACCOUNT_ATTEMPTS`] in
//! the short [`ACCOUNT_WINDOW`]); beyond any of them the login answers 429 without checking. A success
//! gives its attempt back and clears only its own pair. The address is the TCP peer, or behind the operator's
//! `trusted_proxies` the client they name (`crate::client_address`), never a header a client alone could forge.
//! The maps are bounded and, when full, refuse new keys rather than forget counts. The nodes of a cluster also count
//! in the shared database, on its clock, so that attempts spread over the nodes meet the same limits; a node's
//! own count is asked first, so what it alone refuses costs the database nothing, and a login whose attempt the
//! database cannot count is refused (503), never let through uncounted.
//! At most [`MAX_CONCURRENT_CHECKS`] password checks (argon2, deliberately slow) run at once, on blocking
//! threads; a login beyond them is answered 503 at once (it still counts against its address). An address that
//! used up its attempts is answered 429 before its form is read or a page rendered, so that a flood costs the
//! server as little as a request can. An unknown e-mail is checked against a dummy hash so
//! that the answer's timing does not say which e-mails have accounts.

use std::future::{ready, Ready};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use caisse_engine::cluster::{SharedSession, SharedSessions};
use caisse_engine::domain::ids::{random_base62, MerchantId};
use caisse_engine::domain::records::Merchant;
use caisse_engine::domain::time::Timestamp;
use dashmap::DashMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::checker::Checker;
use super::{html, layout, read_form, redirect, DashError, Form};
use crate::config::Environment;
use crate::http::AppState;

pub const SESSION_COOKIE: &str = "caisse_session";
const LOGIN_COOKIE: &str = "caisse_login";
pub const SESSION_IDLE: Duration = Duration::from_secs(12 * 60 * 60);
pub const SESSION_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 60 * 60);
pub const MAX_SESSIONS: usize = 10_000;
/// Sessions one merchant may hold; a new login beyond it ends that merchant's least recently used one.
pub const MAX_SESSIONS_PER_MERCHANT: usize = 20;
/// Attempts one account may make from one address within [`FAILURE_WINDOW`].
pub const MAX_FAILURES: u32 = 5;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(15 * 60);
/// Attempts from one address, whatever the accounts (an office behind one NAT holds several merchants).
pub const MAX_ADDRESS_ATTEMPTS: u32 = 30;
/// Attempts on one account from every address together within [`ACCOUNT_WINDOW`]: it slows a brute force
/// spread over many addresses, and locks the real merchant out for at most this short window.
pub const MAX_ACCOUNT_ATTEMPTS: u32 = 30;
pub const ACCOUNT_WINDOW: Duration = Duration::from_secs(60);
/// Keys tracked for throttling, per map. A full map refuses attempts for new keys rather than forget what it
/// counts, so a flood cannot evict the counters it wants gone.
pub const MAX_TRACKED: usize = 100_000;
/// Password checks (argon2: 19 MiB and tens of milliseconds each) running at once; beyond, a login is answered
/// 503 at once instead of queueing, so a flood of logins costs bounded memory and leaves the API its cores.
pub const MAX_CONCURRENT_CHECKS: usize = 2;
/// How long a throttled login waits before its refusal is sent. An attacker who sends the next guess as soon
/// as the last one is answered is slowed to one guess a second per connection, whatever the server's speed,
/// instead of taking every cycle the API leaves; the wait is a timer, not work.
pub const REFUSAL_DELAY: Duration = Duration::from_secs(1);
/// Refusals waiting out [`REFUSAL_DELAY`] at once; beyond, refusals are sent at once, so a flood of
/// connections cannot make the server hold an unbounded number of them open.
pub const MAX_DELAYED_REFUSALS: usize = 1_024;
const TOKEN_LEN: usize = 32;
/// Longer inputs cannot be a valid account, and are refused before any hashing.
const MAX_EMAIL_LEN: usize = 254;
const MAX_PASSWORD_LEN: usize = 128;

/// The dashboard's own state, shared by every worker of the server.
pub struct DashboardState {
    pub sessions: Sessions,
    /// Attempts per (account, address): what locks an attacker out without locking the merchant out.
    pub by_pair: Throttle,
    pub by_account: Throttle,
    pub by_address: Throttle,
    /// Permits for the password checks running at once.
    checks: tokio::sync::Semaphore,
    /// Permits for the throttled logins waiting out [`REFUSAL_DELAY`].
    delayed_refusals: tokio::sync::Semaphore,
    /// Where they run.
    checker: Checker,
    /// Each merchant's latest replay of a range of webhook notifications.
    pub replays: super::replay::Replays,
    /// `Secure` on cookies: production runs behind https.
    secure_cookies: bool,
}

impl DashboardState {
    /// The dashboard of a node of a cluster: its sessions and login counters are the cluster's.
    pub fn with_shared_sessions(mut self, shared: Option<Arc<dyn SharedSessions>>) -> DashboardState {
        if let Some(shared) = shared {
            self.sessions = Sessions::shared(shared.clone());
            // The kinds name the counters in the shared table; never renumber them.
            self.by_pair.shared = Some((shared.clone(), 1));
            self.by_account.shared = Some((shared.clone(), 2));
            self.by_address.shared = Some((shared, 3));
        }
        self
    }

    pub fn new(environment: Environment) -> DashboardState {
        DashboardState {
            sessions: Sessions::new(MAX_SESSIONS),
            by_pair: Throttle::new(MAX_FAILURES, FAILURE_WINDOW, MAX_TRACKED),
            by_account: Throttle::new(MAX_ACCOUNT_ATTEMPTS, ACCOUNT_WINDOW, MAX_TRACKED),
            by_address: Throttle::new(MAX_ADDRESS_ATTEMPTS, FAILURE_WINDOW, MAX_TRACKED),
            checks: tokio::sync::Semaphore::new(MAX_CONCURRENT_CHECKS),
            delayed_refusals: tokio::sync::Semaphore::new(MAX_DELAYED_REFUSALS),
            checker: Checker::start(),
            replays: super::replay::Replays::default(),
            secure_cookies: environment == Environment::Production,
        }
    }

    /// Waits [`REFUSAL_DELAY`] before a throttled login is answered, when a slot is free.
    async fn delay_refusal(&self) {
        if let Ok(_slot) = self.delayed_refusals.try_acquire() {
            actix_web::rt::time::sleep(REFUSAL_DELAY).await;
        }
    }

    fn cookie(&self, name: &str, value: &str, path: &str, max_age_s: Option<u64>) -> String {
        let mut cookie = format!("{name}={value}; Path={path}; HttpOnly; SameSite=Strict");
        if let Some(age) = max_age_s {
            cookie.push_str(&format!("; Max-Age={age}"));
        }
        if self.secure_cookies {
            cookie.push_str("; Secure");
        }
        cookie
    }
}

// ----- sessions -----

struct Session {
    merchant: MerchantId,
    csrf: String,
    created: Instant,
    last_seen: Instant,
}

/// The server-side sessions, bounded in number and in time.
pub struct Sessions {
    map: DashMap<[u8; 32], Session>,
    max: usize,
    /// The cluster's shared sessions, which then replace the map.
    shared: Option<Arc<dyn SharedSessions>>,
}

/// Activity is written to the shared sessions at most this often per session: the idle limit counts in hours.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

fn wall_ms() -> u64 {
    Timestamp::now().unix_ms()
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    pub fn new(max: usize) -> Sessions {
        Sessions { map: DashMap::new(), max: max.max(1), shared: None }
    }

    /// Sessions kept in a cluster's database, shared by every node.
    pub fn shared(backend: Arc<dyn SharedSessions>) -> Sessions {
        Sessions { map: DashMap::new(), max: 1, shared: Some(backend) }
    }

    /// Opens a session; returns its id (the cookie's value). Fails only when the cluster's database does.
    pub fn create(&self, merchant: MerchantId, now: Instant) -> Result<String, DashError> {
        if let Some(shared) = &self.shared {
            let id = random_base62(TOKEN_LEN);
            let at = wall_ms();
            let session = SharedSession { merchant, csrf: random_base62(TOKEN_LEN), created_ms: at, last_seen_ms: at };
            let idle_before = at.saturating_sub(SESSION_IDLE.as_millis() as u64);
            let made_before = at.saturating_sub(SESSION_MAX_AGE.as_millis() as u64);
            shared
                .put(digest(&id), &session, MAX_SESSIONS_PER_MERCHANT, idle_before, made_before)
                .map_err(|e| DashError::internal("open a shared session", e))?;
            return Ok(id);
        }
        if self.map.len() >= self.max {
            self.map.retain(|_, s| live(s, now));
        }
        if self.map.len() >= self.max {
            let oldest = self.map.iter().min_by_key(|entry| entry.value().last_seen).map(|entry| *entry.key());
            if let Some(key) = oldest {
                self.map.remove(&key);
            }
        }
        let mine: Vec<([u8; 32], Instant)> = self
            .map
            .iter()
            .filter(|entry| entry.value().merchant == merchant)
            .map(|entry| (*entry.key(), entry.value().last_seen))
            .collect();
        if mine.len() >= MAX_SESSIONS_PER_MERCHANT {
            if let Some((key, _)) = mine.iter().min_by_key(|(_, seen)| *seen) {
                self.map.remove(key);
            }
        }
        let id = random_base62(TOKEN_LEN);
        let session = Session { merchant, csrf: random_base62(TOKEN_LEN), created: now, last_seen: now };
        self.map.insert(digest(&id), session);
        Ok(id)
    }

    /// The merchant and CSRF token of a live session, which counts as activity.
    pub fn get(&self, id: &str, now: Instant) -> Option<(MerchantId, String)> {
        let key = digest(id);
        if let Some(shared) = &self.shared {
            // A database that cannot be read sends the merchant back to the login page, which says so.
            let session = shared.get(key).unwrap_or_else(|e| {
                tracing::error!(target: "caisse::dashboard", error = %e, "a shared session could not be read");
                None
            })?;
            let at = wall_ms();
            let idle = Duration::from_millis(at.saturating_sub(session.last_seen_ms));
            let age = Duration::from_millis(at.saturating_sub(session.created_ms));
            if idle >= SESSION_IDLE || age >= SESSION_MAX_AGE {
                let _ = shared.remove(key);
                return None;
            }
            if idle >= TOUCH_EVERY {
                if let Err(e) = shared.touch(key, at) {
                    tracing::warn!(target: "caisse::dashboard", error = %e, "a shared session's activity was not recorded");
                }
            }
            return Some((session.merchant, session.csrf));
        }
        let found = match self.map.get_mut(&key) {
            Some(mut session) if live(&session, now) => {
                session.last_seen = now;
                Some((session.merchant.clone(), session.csrf.clone()))
            }
            Some(_) => None,
            None => return None,
        };
        if found.is_none() {
            self.map.remove(&key);
        }
        found
    }

    pub fn remove(&self, id: &str) {
        if let Some(shared) = &self.shared {
            if let Err(e) = shared.remove(digest(id)) {
                tracing::error!(target: "caisse::dashboard", error = %e, "a shared session could not be ended");
            }
        }
        self.map.remove(&digest(id));
    }

    /// Ends every session of a merchant (suspended, or its password was reset).
    pub fn remove_merchant(&self, merchant: &MerchantId) {
        if let Some(shared) = &self.shared {
            if let Err(e) = shared.remove_merchant(merchant) {
                tracing::error!(target: "caisse::dashboard", error = %e, "a merchant's shared sessions could not be ended");
            }
        }
        self.map.retain(|_, s| s.merchant != *merchant);
    }

    pub fn len(&self) -> usize {
        match &self.shared {
            Some(shared) => shared.count().map_or(0, |n| n as usize),
            None => self.map.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn live(session: &Session, now: Instant) -> bool {
    now.saturating_duration_since(session.last_seen) < SESSION_IDLE
        && now.saturating_duration_since(session.created) < SESSION_MAX_AGE
}

// ----- throttling -----

struct Failures {
    count: u32,
    since: Instant,
}

/// Why a login attempt was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The key has used up its attempts for this long still.
    Wait(Duration),
    /// The cluster's database could not count the attempt.
    Unavailable,
}

/// Login attempts per key (an address, an account, or the pair) within a fixed window. An attempt is
/// reserved before its password is checked, in one step with the check of the limit, so attempts sent in
/// parallel cannot all pass a check made before any of them counted; a successful login gives its
/// reservation back.
pub struct Throttle {
    map: DashMap<String, Failures>,
    max_attempts: u32,
    window: Duration,
    max_keys: usize,
    /// The cluster's counters and this throttle's kind among them, consulted after the map.
    shared: Option<(Arc<dyn SharedSessions>, u8)>,
}

impl Throttle {
    pub fn new(max_attempts: u32, window: Duration, max_keys: usize) -> Throttle {
        Throttle { map: DashMap::new(), max_attempts, window, max_keys: max_keys.max(1), shared: None }
    }

    fn window_ms(&self) -> u64 {
        u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX)
    }

    /// Counts an attempt for `key`, or answers why not. In a cluster the node's own count comes first: the
    /// attempts one node saw are some of those the cluster saw, so a key this node alone refuses is refused
    /// without asking the database, which keeps a flood from one address off it.
    pub fn reserve(&self, key: &str, now: Instant) -> Result<(), Refused> {
        self.reserve_here(key, now)?;
        let Some((shared, kind)) = &self.shared else { return Ok(()) };
        let refused = match shared.reserve_attempt(*kind, digest(key), self.max_attempts, self.window_ms()) {
            Ok(None) => return Ok(()),
            Ok(Some(wait_ms)) => Refused::Wait(Duration::from_millis(wait_ms)),
            Err(e) => {
                tracing::error!(target: "caisse::dashboard", error = %e, "a login attempt could not be counted");
                Refused::Unavailable
            }
        };
        self.forgive_here(key);
        Err(refused)
    }

    fn reserve_here(&self, key: &str, now: Instant) -> Result<(), Refused> {
        if !self.map.contains_key(key) && self.map.len() >= self.max_keys {
            let window = self.window;
            self.map.retain(|_, f| now.saturating_duration_since(f.since) < window);
            if self.map.len() >= self.max_keys {
                tracing::warn!(target: "caisse::dashboard", "login throttling table full: refusing new keys");
                return Err(Refused::Wait(self.window));
            }
        }
        let mut entry = self.map.entry(key.to_owned()).or_insert(Failures { count: 0, since: now });
        let elapsed = now.saturating_duration_since(entry.since);
        if elapsed >= self.window {
            *entry = Failures { count: 0, since: now };
        } else if entry.count >= self.max_attempts {
            return Err(Refused::Wait(self.window - elapsed));
        }
        entry.count += 1;
        Ok(())
    }

    /// How long `key` must still wait, when it has used up its attempts; reserves nothing. A database that
    /// cannot say lets the request on to [`Throttle::reserve`], which refuses it.
    pub fn locked(&self, key: &str, now: Instant) -> Option<Duration> {
        if let Some(wait) = self.locked_here(key, now) {
            return Some(wait);
        }
        let (shared, kind) = self.shared.as_ref()?;
        match shared.attempts_locked(*kind, digest(key), self.max_attempts, self.window_ms()) {
            Ok(wait) => wait.map(Duration::from_millis),
            Err(e) => {
                tracing::error!(target: "caisse::dashboard", error = %e, "a login counter could not be read");
                None
            }
        }
    }

    fn locked_here(&self, key: &str, now: Instant) -> Option<Duration> {
        let entry = self.map.get(key)?;
        let elapsed = now.saturating_duration_since(entry.since);
        (elapsed < self.window && entry.count >= self.max_attempts).then(|| self.window - elapsed)
    }

    /// Gives back one reserved attempt (the login succeeded, or its password was never checked).
    pub fn forgive(&self, key: &str) {
        if let Some((shared, kind)) = &self.shared {
            if let Err(e) = shared.forgive_attempt(*kind, digest(key)) {
                tracing::warn!(target: "caisse::dashboard", error = %e, "a login attempt was not given back");
            }
        }
        self.forgive_here(key);
    }

    fn forgive_here(&self, key: &str) {
        if let Some(mut entry) = self.map.get_mut(key) {
            entry.count = entry.count.saturating_sub(1);
        }
    }

    pub fn clear(&self, key: &str) {
        if let Some((shared, kind)) = &self.shared {
            if let Err(e) = shared.clear_attempts(*kind, digest(key)) {
                tracing::warn!(target: "caisse::dashboard", error = %e, "login attempts were not cleared");
            }
        }
        self.map.remove(key);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

// ----- the logged-in merchant -----

/// The merchant behind a live session, read fresh from the store on every request (a rolled key or a new
/// webhook URL shows at once), with the session's CSRF token for the page's forms.
pub struct LoggedIn {
    pub merchant: Merchant,
    pub csrf: String,
    session_id: String,
}

impl LoggedIn {
    /// Reads a form posted in this session, refusing it unless it carries the session's CSRF token.
    pub async fn form(&self, payload: web::Payload) -> Result<Form, DashError> {
        let form = read_form(payload).await?;
        self.check_csrf(&form)?;
        Ok(form)
    }

    /// Refuses a form whose hidden `csrf` field is not this session's token.
    pub fn check_csrf(&self, form: &Form) -> Result<(), DashError> {
        let given = form.get("csrf").unwrap_or("");
        if given.is_empty() || !bool::from(given.as_bytes().ct_eq(self.csrf.as_bytes())) {
            return Err(DashError::Forbidden(
                "Requête refusée : le jeton anti-CSRF du formulaire manque ou ne correspond pas. Rechargez la page.",
            ));
        }
        Ok(())
    }
}

impl FromRequest for LoggedIn {
    type Error = DashError;
    type Future = Ready<Result<LoggedIn, DashError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(logged_in(req))
    }
}

fn logged_in(req: &HttpRequest) -> Result<LoggedIn, DashError> {
    let state = app_state(req)?;
    let dash = dashboard_state(req)?;
    let session_id = cookie(req, SESSION_COOKIE).ok_or(DashError::Login)?;
    let (merchant_id, csrf) = dash.sessions.get(&session_id, Instant::now()).ok_or(DashError::Login)?;
    let merchant = state.engine.merchant(&merchant_id)?.ok_or(DashError::Login)?;
    if state.engine.suspended_since(&merchant_id)?.is_some() {
        dash.sessions.remove(&session_id);
        return Err(DashError::Login);
    }
    Ok(LoggedIn { merchant, csrf, session_id })
}

fn app_state(req: &HttpRequest) -> Result<&web::Data<AppState>, DashError> {
    req.app_data::<web::Data<AppState>>().ok_or_else(|| DashError::internal("dashboard", "no AppState registered"))
}

fn dashboard_state(req: &HttpRequest) -> Result<&web::Data<DashboardState>, DashError> {
    req.app_data::<web::Data<DashboardState>>()
        .ok_or_else(|| DashError::internal("dashboard", "no DashboardState registered"))
}

/// The value of a cookie sent with the request (the `Cookie` headers are parsed by hand: names and values
/// we set are plain base62, so no decoding is needed).
pub fn cookie(req: &HttpRequest, name: &str) -> Option<String> {
    req.headers()
        .get_all(actix_web::http::header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, v)| *k == name && !v.is_empty())
        .map(|(_, v)| v.to_owned())
}

// ----- handlers -----

/// `GET /login`: the form, with a fresh double-submit token.
pub async fn login_form(req: HttpRequest, state: web::Data<AppState>, dash: web::Data<DashboardState>) -> HttpResponse {
    if logged_in(&req).is_ok() {
        return redirect("/");
    }
    if let Some(refused) = locked_address(&dash, &login_address(&req, &state)) {
        dash.delay_refusal().await;
        return refused;
    }
    login_page(&dash, &req, StatusCode::OK, "", None)
}

/// The client address a login is counted against.
fn login_address(req: &HttpRequest, state: &AppState) -> String {
    crate::client_address::of_request(req, &state.settings.trusted_proxies)
        .map(crate::client_address::counted)
        .map_or_else(|| "unknown".to_owned(), |ip| ip.to_string())
}

/// An address that used up its attempts is refused before its form is read or a page is rendered, and
/// after [`REFUSAL_DELAY`]: during a flood, refusing costs the server as little work as it can and slows the
/// attacker's next guess, which leaves the API its cores.
fn locked_address(dash: &DashboardState, address: &str) -> Option<HttpResponse> {
    let wait = dash.by_address.locked(address, Instant::now())?;
    let minutes = wait.as_secs().div_ceil(60).max(1);
    let mut response = HttpResponse::TooManyRequests();
    response.insert_header((actix_web::http::header::RETRY_AFTER, wait.as_secs().max(1).to_string()));
    Some(response.content_type("text/html; charset=utf-8").body(format!(
        "<!DOCTYPE html><html lang=\"fr\"><meta charset=\"utf-8\"><title>Connexion</title>\
         <p>Trop de tentatives échouées depuis votre adresse. Réessayez dans {minutes} min.</p></html>"
    )))
}

fn login_page(
    dash: &DashboardState,
    req: &HttpRequest,
    status: StatusCode,
    email: &str,
    error: Option<String>,
) -> HttpResponse {
    let token = random_base62(TOKEN_LEN);
    let environment = app_state(req).map(|s| s.settings.environment).unwrap_or(Environment::Sandbox);
    let mut response = html(status, layout::login_page(environment, &token, email, error.as_deref()));
    if let Ok(value) = dash.cookie(LOGIN_COOKIE, &token, "/login", Some(3600)).parse() {
        response.headers_mut().append(actix_web::http::header::SET_COOKIE, value);
    }
    response
}

/// `POST /login`.
pub async fn login(
    req: HttpRequest,
    state: web::Data<AppState>,
    dash: web::Data<DashboardState>,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    let address = login_address(&req, &state);
    if let Some(refused) = locked_address(&dash, &address) {
        dash.delay_refusal().await;
        return Ok(refused);
    }
    let form = read_form(payload).await?;
    let expected = cookie(&req, LOGIN_COOKIE).unwrap_or_default();
    let given = form.get("csrf").unwrap_or("");
    if expected.is_empty() || !bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        let message = "Le formulaire a expiré ou ne vient pas de cette page : reconnectez-vous depuis ce formulaire.";
        return Ok(login_page(&dash, &req, StatusCode::FORBIDDEN, "", Some(message.into())));
    }
    let email = form.get("email").unwrap_or("").trim().to_lowercase();
    let password = form.get("password").unwrap_or("").to_owned();
    let pair = format!("{email}\n{address}");
    let now = Instant::now();
    // Reserved before the password is checked, address first: one address cannot fill the other maps.
    let reserved = dash
        .by_address
        .reserve(&address, now)
        .and_then(|()| dash.by_pair.reserve(&pair, now).inspect_err(|_| dash.by_address.forgive(&address)));
    let reserved = reserved.and_then(|()| {
        dash.by_account.reserve(&email, now).inspect_err(|_| {
            dash.by_pair.forgive(&pair);
            dash.by_address.forgive(&address);
        })
    });
    match reserved {
        Ok(()) => {}
        Err(Refused::Wait(wait)) => {
            tracing::warn!(target: "caisse::dashboard", %address, "login throttled");
            dash.delay_refusal().await;
            let minutes = wait.as_secs().div_ceil(60).max(1);
            let message = format!("Trop de tentatives échouées. Réessayez dans {minutes} min.");
            return Ok(login_page(&dash, &req, StatusCode::TOO_MANY_REQUESTS, &email, Some(message)));
        }
        Err(Refused::Unavailable) => {
            let message = "La connexion est momentanément impossible. Réessayez dans un instant.".to_owned();
            return Ok(busy_page(&dash, &req, &email, message));
        }
    }
    let give_back = || {
        dash.by_pair.forgive(&pair);
        dash.by_account.forgive(&email);
        dash.by_address.forgive(&address);
    };
    let Ok(_permit) = dash.checks.try_acquire() else {
        // Unchecked, so the account and the pair get their attempt back; the address keeps it counted, so an
        // address that floods while every check is busy runs out of attempts like one that guesses.
        dash.by_pair.forgive(&pair);
        dash.by_account.forgive(&email);
        tracing::warn!(target: "caisse::dashboard", %address, "login refused: password checks all busy");
        let message = "Trop de connexions en cours. Réessayez dans un instant.".to_owned();
        return Ok(busy_page(&dash, &req, &email, message));
    };
    let merchant = if email.len() <= MAX_EMAIL_LEN { state.engine.merchant_by_email(&email)? } else { None };
    let valid = password.len() <= MAX_PASSWORD_LEN && merchant.is_some();
    let hash = merchant.as_ref().map(|m| m.password_hash.clone());
    let verified = dash.checker.verify(password, hash).await;
    // The password may have been replaced while it was checked (an operator's reset, which also ends the
    // merchant's sessions): a session is opened only for the password still in force.
    let verified = verified
        && match &merchant {
            Some(checked) => state
                .engine
                .merchant_by_email(&email)?
                .is_some_and(|now| bool::from(now.password_hash.as_bytes().ct_eq(checked.password_hash.as_bytes()))),
            None => false,
        };
    match merchant {
        Some(merchant) if valid && verified && state.engine.suspended_since(&merchant.id)?.is_some() => {
            give_back();
            tracing::info!(target: "caisse::dashboard", merchant = %merchant.id.as_str(), "login of a suspended merchant refused");
            let message = "Ce compte est suspendu. Contactez l'opérateur du service.".to_owned();
            Ok(login_page(&dash, &req, StatusCode::FORBIDDEN, &email, Some(message)))
        }
        Some(merchant) if valid && verified => {
            // The merchant's own pair starts afresh; the address and the account only get this attempt back,
            // so a success of one account never wipes the failures counted against others.
            dash.by_pair.clear(&pair);
            dash.by_account.forgive(&email);
            dash.by_address.forgive(&address);
            let session_id = dash.sessions.create(merchant.id.clone(), Instant::now())?;
            tracing::info!(target: "caisse::dashboard", merchant = %merchant.id.as_str(), "dashboard login");
            let mut response = redirect("/");
            let headers = response.headers_mut();
            for value in
                [dash.cookie(SESSION_COOKIE, &session_id, "/", None), dash.cookie(LOGIN_COOKIE, "", "/login", Some(0))]
            {
                if let Ok(value) = value.parse() {
                    headers.append(actix_web::http::header::SET_COOKIE, value);
                }
            }
            Ok(response)
        }
        _ => {
            tracing::info!(target: "caisse::dashboard", %address, "dashboard login failed");
            let message = "E-mail ou mot de passe incorrect.".to_owned();
            Ok(login_page(&dash, &req, StatusCode::UNAUTHORIZED, &email, Some(message)))
        }
    }
}

/// The login form answered 503 with `Retry-After: 1`: nothing was checked, the merchant may simply retry.
fn busy_page(dash: &DashboardState, req: &HttpRequest, email: &str, message: String) -> HttpResponse {
    let mut page = login_page(dash, req, StatusCode::SERVICE_UNAVAILABLE, email, Some(message));
    page.headers_mut()
        .insert(actix_web::http::header::RETRY_AFTER, actix_web::http::header::HeaderValue::from_static("1"));
    page
}

/// `POST /logout`: ends the session on the server and clears the cookie.
pub async fn logout(
    user: LoggedIn,
    dash: web::Data<DashboardState>,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    user.form(payload).await?;
    dash.sessions.remove(&user.session_id);
    let mut response = redirect("/login");
    if let Ok(value) = dash.cookie(SESSION_COOKIE, "", "/", Some(0)).parse() {
        response.headers_mut().append(actix_web::http::header::SET_COOKIE, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merchant() -> MerchantId {
        MerchantId::new()
    }

    #[test]
    fn sessions_expire_when_idle_and_when_old() {
        let sessions = Sessions::new(10);
        let t0 = Instant::now();
        let id = sessions.create(merchant(), t0).unwrap();
        assert!(sessions.get(&id, t0 + Duration::from_secs(60)).is_some());
        assert!(sessions.get(&id, t0 + Duration::from_secs(60) + SESSION_IDLE).is_none());
        assert!(sessions.is_empty(), "an expired session is dropped when seen");
        let id = sessions.create(merchant(), t0).unwrap();
        // Active every hour, but never beyond the maximum age.
        let mut now = t0;
        while now < t0 + SESSION_MAX_AGE - Duration::from_secs(3600) {
            now += Duration::from_secs(3600);
            assert!(sessions.get(&id, now).is_some());
        }
        assert!(sessions.get(&id, t0 + SESSION_MAX_AGE).is_none());
        assert!(sessions.get("not-a-session", t0).is_none());
    }

    #[test]
    fn sessions_are_bounded_and_evict_the_least_recently_used() {
        let sessions = Sessions::new(3);
        let t0 = Instant::now();
        let ids: Vec<String> =
            (0..3).map(|i| sessions.create(merchant(), t0 + Duration::from_secs(i)).unwrap()).collect();
        assert!(sessions.get(&ids[0], t0 + Duration::from_secs(10)).is_some());
        let newest = sessions.create(merchant(), t0 + Duration::from_secs(11)).unwrap();
        assert_eq!(sessions.len(), 3);
        assert!(sessions.get(&ids[1], t0 + Duration::from_secs(12)).is_none(), "least recently used goes");
        assert!(sessions.get(&ids[0], t0 + Duration::from_secs(12)).is_some());
        assert!(sessions.get(&newest, t0 + Duration::from_secs(12)).is_some());
    }

    #[test]
    fn throttle_counts_before_the_check_until_the_window_ends() {
        let throttle = Throttle::new(3, Duration::from_secs(900), 100);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(throttle.reserve("a@example.com", t0).is_ok());
        }
        assert_eq!(
            throttle.reserve("a@example.com", t0 + Duration::from_secs(100)),
            Err(Refused::Wait(Duration::from_secs(800)))
        );
        assert!(throttle.reserve("b@example.com", t0).is_ok(), "keys are apart");
        // A success gives its attempt back; only that one.
        throttle.forgive("a@example.com");
        assert!(throttle.reserve("a@example.com", t0).is_ok());
        assert!(throttle.reserve("a@example.com", t0).is_err());
        assert!(throttle.reserve("a@example.com", t0 + Duration::from_secs(900)).is_ok(), "a new window");
        throttle.clear("a@example.com");
        assert!(throttle.reserve("a@example.com", t0).is_ok());
    }

    /// Reservations made from many threads at once never exceed the limit.
    #[test]
    fn parallel_reservations_stop_at_the_limit() {
        let throttle = std::sync::Arc::new(Throttle::new(5, Duration::from_secs(900), 100));
        let t0 = Instant::now();
        let granted: usize = (0..8)
            .map(|_| {
                let throttle = throttle.clone();
                std::thread::spawn(move || (0..50).filter(|_| throttle.reserve("victim", t0).is_ok()).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().expect("a thread"))
            .sum();
        assert_eq!(granted, 5);
    }

    #[test]
    fn a_full_throttle_refuses_new_keys_and_keeps_its_counts() {
        let throttle = Throttle::new(1, Duration::from_secs(900), 50);
        let t0 = Instant::now();
        assert!(throttle.reserve("victim", t0).is_ok());
        for i in 0..500u64 {
            let _ = throttle.reserve(&format!("10.0.0.{i}"), t0 + Duration::from_millis(i));
        }
        assert!(throttle.len() <= 50);
        assert!(throttle.reserve("victim", t0 + Duration::from_secs(1)).is_err(), "the flood evicted nothing");
        assert!(throttle.reserve("newcomer", t0 + Duration::from_secs(1)).is_err(), "full: new keys wait");
        assert!(throttle.reserve("newcomer", t0 + Duration::from_secs(901)).is_ok(), "expired entries make room");
    }

    #[test]
    fn a_merchant_holds_a_bounded_number_of_sessions() {
        let sessions = Sessions::new(1_000);
        let t0 = Instant::now();
        let m = merchant();
        let ids: Vec<String> = (0..MAX_SESSIONS_PER_MERCHANT + 3)
            .map(|i| sessions.create(m.clone(), t0 + Duration::from_secs(i as u64)).unwrap())
            .collect();
        assert_eq!(sessions.len(), MAX_SESSIONS_PER_MERCHANT);
        assert!(sessions.get(&ids[0], t0).is_none(), "the oldest went");
        assert!(sessions.get(ids.last().expect("one"), t0).is_some());
    }
}
