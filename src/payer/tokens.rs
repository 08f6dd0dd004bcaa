//! The payment form's token: `nonce.issued.mac`, where the MAC (HMAC-SHA256 under a key the server draws at
//! start) covers the link, the nonce, the time it was issued and the browser's cookie. A post is taken only
//! with a token this server issued for this link, within [`TOKEN_LIFE_S`], from the browser that loaded the
//! form (the cookie is `SameSite=Lax`, so another site's page cannot post with it). The nonce is new with
//! each form, which makes it the payment's idempotency key: posting one form twice is one payment.
//!
//! The key lives in memory: after a restart a form loaded before it is refused, and the customer gets a fresh
//! one with what they typed kept. The nodes of a cluster derive one key from the cluster's secret instead, so
//! that a form loaded from one node posts to any other (and survives restarts).

use caisse_engine::domain::ids::random_base62;
use caisse_engine::domain::time::Timestamp;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The cookie that names a browser to its forms.
pub const COOKIE: &str = "caisse_payer";
/// How long a form may wait before it is posted.
pub const TOKEN_LIFE_S: u64 = 60 * 60;
const NONCE_LEN: usize = 22;
const BROWSER_LEN: usize = 22;

pub struct FormKey([u8; 32]);

/// A token to put in the form, and the browser id its cookie must carry.
pub struct Issued {
    pub token: String,
    pub browser: String,
    /// Whether the browser id is new, so the answer must set the cookie.
    pub new_browser: bool,
}

impl FormKey {
    /// The key every node of a cluster shares, so a form loaded from one node is taken by another.
    pub fn shared(key: [u8; 32]) -> FormKey {
        FormKey(key)
    }

    pub fn random() -> FormKey {
        let mut key = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut key);
        FormKey(key)
    }

    fn mac(&self, link: &str, nonce: &str, issued_s: u64, browser: &str) -> String {
        // HMAC takes a key of any length, so this cannot fail; an empty MAC would match nothing.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else { return String::new() };
        for part in [link, nonce, &issued_s.to_string(), browser] {
            mac.update(part.as_bytes());
            mac.update(&[0]);
        }
        hex::encode(mac.finalize().into_bytes())
    }

    /// A token for a form of `link`, for the browser named by `browser` (a new one when it has none).
    pub fn issue(&self, link: &str, browser: Option<&str>, now: Timestamp) -> Issued {
        let (browser, new_browser) = match browser.filter(|b| is_browser_id(b)) {
            Some(b) => (b.to_owned(), false),
            None => (random_base62(BROWSER_LEN), true),
        };
        let nonce = random_base62(NONCE_LEN);
        let issued_s = now.unix_s();
        let token = format!("{nonce}.{issued_s}.{}", self.mac(link, &nonce, issued_s, &browser));
        Issued { token, browser, new_browser }
    }

    /// The nonce of a valid token for `link` from `browser`, or why the form is refused, as the customer reads it.
    pub fn check(
        &self,
        token: &str,
        browser: Option<&str>,
        link: &str,
        now: Timestamp,
    ) -> Result<String, &'static str> {
        let refused = "Le formulaire n'est plus valable (page restée ouverte trop longtemps, ou ouverte ailleurs).";
        let browser = browser.filter(|b| is_browser_id(b)).ok_or(
            "Votre navigateur n'a pas renvoyé le cookie de ce formulaire : autorisez les cookies pour ce site.",
        )?;
        let mut parts = token.split('.');
        let (Some(nonce), Some(issued), Some(mac), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(refused);
        };
        let issued_s: u64 = issued.parse().map_err(|_| refused)?;
        let expected = self.mac(link, nonce, issued_s, browser);
        if nonce.len() != NONCE_LEN || expected.is_empty() || !bool::from(expected.as_bytes().ct_eq(mac.as_bytes())) {
            return Err(refused);
        }
        if now.unix_s().saturating_sub(issued_s) > TOKEN_LIFE_S || issued_s > now.unix_s().saturating_add(60) {
            return Err(refused);
        }
        Ok(nonce.to_owned())
    }
}

fn is_browser_id(text: &str) -> bool {
    text.len() == BROWSER_LEN && text.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// The `Set-Cookie` value naming this browser to its forms, for the payment pages only. `Lax`, not `Strict`:
/// the page is opened from a chat or an SMS, and the form that follows must find the cookie.
pub fn set_cookie(issued: &Issued, secure: bool) -> String {
    let mut cookie =
        format!("{COOKIE}={}; Path=/payer; HttpOnly; SameSite=Lax; Max-Age={}", issued.browser, 24 * 60 * 60);
    if secure {
        cookie.push_str("; Secure");
    }
    cookie
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: &str = "lnk_01JD0000000000000000000000";

    #[test]
    fn a_token_is_taken_once_issued_for_this_link_and_browser_within_its_life() {
        let key = FormKey::random();
        let now = Timestamp::from_unix_ms(1_800_000_000_000);
        let issued = key.issue(LINK, None, now);
        assert!(issued.new_browser);
        let browser = Some(issued.browser.as_str());
        let nonce = key.check(&issued.token, browser, LINK, now).expect("valid");
        assert!(issued.token.starts_with(&nonce));
        let again = key.issue(LINK, browser, now);
        assert!(!again.new_browser);
        assert_ne!(key.check(&again.token, browser, LINK, now).unwrap(), nonce, "a new nonce per form");

        assert!(key.check(&issued.token, browser, "lnk_01JD0000000000000000000001", now).is_err(), "other link");
        assert!(key.check(&issued.token, Some("AAAAAAAAAAAAAAAAAAAAAA"), LINK, now).is_err(), "other browser");
        assert!(key.check(&issued.token, None, LINK, now).is_err(), "no cookie");
        assert!(FormKey::random().check(&issued.token, browser, LINK, now).is_err(), "another server's key");
        let late = now.plus_ms((TOKEN_LIFE_S + 1) * 1000);
        assert!(key.check(&issued.token, browser, LINK, late).is_err(), "too old");
        let forged = issued.token.replace('.', ".1");
        assert!(key.check(&forged, browser, LINK, now).is_err());
        assert!(key.check("", browser, LINK, now).is_err());
        assert!(key.check("a.b.c.d", browser, LINK, now).is_err());
    }
}
