//! pawaPay's callback signatures: RFC 9421 HTTP Message Signatures as pawaPay's own signature library makes
//! them (label `sig-pp`, alg `ecdsa-p256-sha256`, `Content-Digest` in SHA-512, the custom `Signature-Date`).
//!
//! The signature base covers, in this order: `"@method" "@authority" "@path" "signature-date"
//! "content-digest" "content-type" "content-length"`, then `"@signature-params"` with the parameters
//! `alg`, `keyid`, `created` and `expires` (created + 60 s), which is what pawaPay's library emits by default.
//! The key pair is made when the fake starts; its public half is served by `GET /v2/public-key/http`.
//!
//! ECDSA signatures are raw `r||s` (64 bytes, RFC 9421 §3.3.4) by default, or DER (what Java's and Node's
//! `SHA256withECDSA` produce) with the `signature_encoding` knob, since which one pawaPay sends is unverified.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::{EncodePublicKey, LineEnding};
use sha2::{Digest, Sha512};

pub const KEY_ID: &str = "HTTP_EC_P256_KEY:1";
pub const LABEL: &str = "sig-pp";
const COMPONENTS: &str =
    r#"("@method" "@authority" "@path" "signature-date" "content-digest" "content-type" "content-length")"#;
const EXPIRES_AFTER_S: u64 = 60;

pub struct Signer {
    key: SigningKey,
    public_pem: String,
}

/// Everything a signature depends on besides the key.
pub struct Message<'a> {
    pub method: &'a str,
    pub url: &'a str,
    pub body: &'a [u8],
    pub content_type: &'a str,
    /// RFC 3339, sent as `Signature-Date`.
    pub date: &'a str,
    pub created_s: u64,
}

impl Signer {
    /// A fresh P-256 key pair from the operating system's randomness.
    pub fn generate() -> Result<Signer, String> {
        let key = SigningKey::random(&mut rand::rngs::OsRng);
        let public_pem =
            key.verifying_key().to_public_key_pem(LineEnding::LF).map_err(|e| format!("public key PEM: {e}"))?;
        Ok(Signer { key, public_pem })
    }

    pub fn public_pem(&self) -> &str {
        &self.public_pem
    }

    /// The headers to add to a signed callback: Content-Digest, Signature-Date, Signature-Input, Signature.
    /// `der` picks the DER signature encoding; `corrupt` flips a bit of the signature (a forged callback).
    pub fn headers(&self, message: &Message, der: bool, corrupt: bool) -> Result<Vec<(String, String)>, String> {
        let digest = content_digest(message.body);
        let params = signature_params(message.created_s);
        let base = signature_base(message, &digest, &params)?;
        let signature: Signature = self.key.sign(base.as_bytes());
        let mut bytes = if der { signature.to_der().as_bytes().to_vec() } else { signature.to_bytes().to_vec() };
        if corrupt {
            if let Some(last) = bytes.last_mut() {
                *last ^= 0x01;
            }
        }
        Ok(vec![
            ("Content-Digest".into(), digest),
            ("Signature-Date".into(), message.date.to_owned()),
            ("Signature-Input".into(), format!("{LABEL}={params}")),
            ("Signature".into(), format!("{LABEL}=:{}:", BASE64.encode(bytes))),
        ])
    }
}

/// `sha-512=:<base64>:` (RFC 9530).
pub fn content_digest(body: &[u8]) -> String {
    format!("sha-512=:{}:", BASE64.encode(Sha512::digest(body)))
}

fn signature_params(created_s: u64) -> String {
    format!(
        r#"{COMPONENTS};alg="ecdsa-p256-sha256";keyid="{KEY_ID}";created={created_s};expires={}"#,
        created_s + EXPIRES_AFTER_S
    )
}

/// The RFC 9421 signature base: one `"name": value` line per component, then `"@signature-params"`, joined
/// by LF with no trailing newline.
pub fn signature_base(message: &Message, digest: &str, params: &str) -> Result<String, String> {
    let uri: awc::http::Uri = message.url.parse().map_err(|e| format!("callback URL {:?}: {e}", message.url))?;
    let host = uri.host().ok_or_else(|| format!("callback URL {:?} has no host", message.url))?;
    // @authority is host[:port] in lower case, the port left out when it is the scheme's default (RFC 9421
    // §2.2.3), which is also what the Host header then carries.
    let default_port = match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    let authority = match uri.port_u16() {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_owned(),
    }
    .to_ascii_lowercase();
    let path = match uri.path() {
        "" => "/",
        path => path,
    };
    Ok([
        format!("\"@method\": {}", message.method.to_ascii_uppercase()),
        format!("\"@authority\": {authority}"),
        format!("\"@path\": {path}"),
        format!("\"signature-date\": {}", message.date),
        format!("\"content-digest\": {digest}"),
        format!("\"content-type\": {}", message.content_type),
        format!("\"content-length\": {}", message.body.len()),
        format!("\"@signature-params\": {params}"),
    ]
    .join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Verifier as _;
    use p256::ecdsa::VerifyingKey;
    use p256::pkcs8::DecodePublicKey;

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
        headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).unwrap()
    }

    /// Verifies as a callback receiver would: rebuild the base from the request and Signature-Input, check
    /// the digest, then the signature with the key from the served PEM.
    fn verify(signer: &Signer, message: &Message, headers: &[(String, String)], der: bool) -> bool {
        let public = VerifyingKey::from_public_key_pem(signer.public_pem()).unwrap();
        let digest = header(headers, "Content-Digest");
        if digest != content_digest(message.body) {
            return false;
        }
        let input = header(headers, "Signature-Input");
        let params = input.strip_prefix("sig-pp=").unwrap();
        let base = signature_base(message, digest, params).unwrap();
        let sig = header(headers, "Signature").strip_prefix("sig-pp=:").unwrap().strip_suffix(':').unwrap();
        let bytes = BASE64.decode(sig).unwrap();
        let signature = if der { Signature::from_der(&bytes) } else { Signature::from_slice(&bytes) };
        signature.is_ok_and(|s| public.verify(base.as_bytes(), &s).is_ok())
    }

    #[test]
    fn callbacks_verify_with_the_served_key_in_both_encodings() {
        let signer = Signer::generate().unwrap();
        let body = br#"{"depositId":"f4401bd2-1568-4140-bf2d-eb77d2b2b639","status":"COMPLETED"}"#;
        let message = Message {
            method: "POST",
            url: "http://127.0.0.1:8080/callbacks/deposit",
            body,
            content_type: "application/json",
            date: "2025-01-31T10:00:00Z",
            created_s: 1_738_317_600,
        };
        for der in [false, true] {
            let headers = signer.headers(&message, der, false).unwrap();
            assert!(verify(&signer, &message, &headers, der), "der={der}");
            let forged = signer.headers(&message, der, true).unwrap();
            assert!(!verify(&signer, &message, &forged, der), "a corrupted signature must not verify (der={der})");
        }
        let raw = signer.headers(&message, false, false).unwrap();
        let encoded = header(&raw, "Signature").strip_prefix("sig-pp=:").unwrap().strip_suffix(':').unwrap();
        assert_eq!(BASE64.decode(encoded).unwrap().len(), 64, "raw r||s");
        let tampered = Message { body: br#"{"status":"FAILED"}"#, ..message };
        assert!(!verify(&signer, &tampered, &raw, false), "another body does not match the digest");
    }

    #[test]
    fn signature_base_is_the_rfc_9421_form() {
        let message = Message {
            method: "post",
            url: "https://Merchant.example.com/cb/pawapay?x=1",
            body: b"{}",
            content_type: "application/json",
            date: "2025-01-31T10:00:00Z",
            created_s: 100,
        };
        let params = signature_params(100);
        let base = signature_base(&message, "sha-512=:abc=:", &params).unwrap();
        let expected = "\"@method\": POST\n\"@authority\": merchant.example.com\n\"@path\": /cb/pawapay\n\
\"signature-date\": 2025-01-31T10:00:00Z\n\"content-digest\": sha-512=:abc=:\n\"content-type\": application/json\n\
\"content-length\": 2\n\"@signature-params\": (\"@method\" \"@authority\" \"@path\" \"signature-date\" \
\"content-digest\" \"content-type\" \"content-length\");alg=\"ecdsa-p256-sha256\";keyid=\"HTTP_EC_P256_KEY:1\";\
created=100;expires=160";
        assert_eq!(base, expected);
        let with_port = Message { url: "http://127.0.0.1:9000/cb", ..message };
        assert!(signature_base(&with_port, "d", &params).unwrap().contains("\"@authority\": 127.0.0.1:9000\n"));
    }
}
