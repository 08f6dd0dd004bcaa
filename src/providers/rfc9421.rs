//! Verifying an RFC 9421 HTTP message signature (with an RFC 9530 `Content-Digest`), as pawaPay signs its
//! callbacks: the `Signature-Input` member names the covered components and the parameters, the signature
//! base is rebuilt from the request as received, and the signature is checked with ECDSA P-256 / SHA-256.
//! Raw `r||s` and DER signatures are both accepted, since which one a provider sends is not settled.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{Signature, VerifyingKey};
use sha2::{Digest, Sha256, Sha512};

/// What the base is rebuilt from: the request as it arrived.
pub struct Received<'a> {
    pub method: &'a str,
    /// The request's `Host`, as the sender addressed it.
    pub authority: &'a str,
    pub path: &'a str,
    pub header: &'a dyn Fn(&str) -> Option<String>,
    pub body: &'a [u8],
}

/// The signature's label, key id and parameters, read from `Signature-Input`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub label: String,
    pub components: Vec<String>,
    /// The member's value after `label=`, exactly as sent: the `@signature-params` line of the base.
    pub params: String,
    pub keyid: Option<String>,
    pub alg: Option<String>,
}

/// Parses the first member of a `Signature-Input` header (`label=("a" "b");k=v;...`).
pub fn parse_input(header: &str) -> Result<Input, String> {
    let (label, params) = header.split_once('=').ok_or("Signature-Input has no member")?;
    let params = params.trim();
    let list =
        params.strip_prefix('(').and_then(|p| p.split_once(')')).ok_or("Signature-Input has no component list")?;
    let components = list
        .0
        .split_whitespace()
        .map(|c| {
            c.strip_prefix('"').and_then(|c| c.strip_suffix('"')).map(str::to_owned).ok_or("a component is not quoted")
        })
        .collect::<Result<Vec<_>, _>>()?;
    let param = |name: &str| {
        list.1
            .split(';')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim().trim_matches('"').to_owned())
    };
    Ok(Input {
        label: label.trim().to_owned(),
        components,
        keyid: param("keyid"),
        alg: param("alg"),
        params: params.to_owned(),
    })
}

/// The bytes of the `Signature` member of `label` (`label=:base64:`).
fn signature_bytes(header: &str, label: &str) -> Result<Vec<u8>, String> {
    let value = header
        .split(',')
        .filter_map(|m| m.trim().split_once('='))
        .find(|(l, _)| l.trim() == label)
        .map(|(_, v)| v.trim())
        .ok_or_else(|| format!("no signature labelled {label}"))?;
    let b64 =
        value.strip_prefix(':').and_then(|v| v.strip_suffix(':')).ok_or("the signature is not a byte sequence")?;
    BASE64.decode(b64).map_err(|e| format!("the signature is not base64: {e}"))
}

/// Checks `Content-Digest` against the body (sha-512 or sha-256).
pub fn check_digest(header: &str, body: &[u8]) -> Result<(), String> {
    for member in header.split(',') {
        let Some((alg, value)) = member.trim().split_once('=') else { continue };
        let expected = match alg.trim() {
            "sha-512" => Sha512::digest(body).to_vec(),
            "sha-256" => Sha256::digest(body).to_vec(),
            _ => continue,
        };
        let b64 = value.trim().trim_matches(':');
        let given = BASE64.decode(b64).map_err(|e| format!("Content-Digest is not base64: {e}"))?;
        return if given == expected { Ok(()) } else { Err("Content-Digest does not match the body".into()) };
    }
    Err("Content-Digest has no sha-512 or sha-256".into())
}

/// The signature base of `input`'s components for the request.
pub fn base(input: &Input, request: &Received) -> Result<String, String> {
    let mut lines = Vec::with_capacity(input.components.len() + 1);
    for component in &input.components {
        let value = match component.as_str() {
            "@method" => request.method.to_ascii_uppercase(),
            "@authority" => request.authority.to_ascii_lowercase(),
            "@path" => request.path.to_owned(),
            name if name.starts_with('@') => return Err(format!("component {name} is not supported")),
            name => {
                (request.header)(name).ok_or_else(|| format!("covered header {name} is missing"))?.trim().to_owned()
            }
        };
        lines.push(format!("\"{component}\": {value}"));
    }
    lines.push(format!("\"@signature-params\": {}", input.params));
    Ok(lines.join("\n"))
}

/// Verifies the request's signature with `key`: the digest, then the ECDSA P-256 signature over the base.
pub fn verify(request: &Received, input: &Input, key: &VerifyingKey) -> Result<(), String> {
    if input.alg.as_deref().is_some_and(|a| a != "ecdsa-p256-sha256") {
        return Err(format!("algorithm {:?} is not supported", input.alg));
    }
    if !input.components.iter().any(|c| c == "content-digest") {
        return Err("the signature does not cover the body's digest".into());
    }
    let digest = (request.header)("content-digest").ok_or("Content-Digest is missing")?;
    check_digest(&digest, request.body)?;
    let signature = (request.header)("signature").ok_or("Signature is missing")?;
    let bytes = signature_bytes(&signature, &input.label)?;
    let signature = Signature::from_slice(&bytes)
        .or_else(|_| Signature::from_der(&bytes))
        .map_err(|_| "the signature is neither r||s nor DER".to_owned())?;
    let base = base(input, request)?;
    key.verify(base.as_bytes(), &signature).map_err(|_| "the signature does not verify".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer as _;
    use p256::ecdsa::SigningKey;

    #[test]
    fn a_signed_request_verifies_and_any_change_breaks_it() {
        let key = SigningKey::random(&mut rand::rngs::OsRng);
        let body = br#"{"depositId":"x","status":"COMPLETED"}"#;
        let digest = format!("sha-512=:{}:", BASE64.encode(Sha512::digest(body)));
        let params = r#"("@method" "@authority" "@path" "signature-date" "content-digest" "content-type" "content-length");alg="ecdsa-p256-sha256";keyid="HTTP_EC_P256_KEY:1";created=1;expires=61"#;
        let headers = |digest: String, signature: String| {
            move |name: &str| match name {
                "signature-date" => Some("2026-11-25T10:00:00Z".to_owned()),
                "content-digest" => Some(digest.clone()),
                "content-type" => Some("application/json".to_owned()),
                "content-length" => Some(body.len().to_string()),
                "signature" => Some(signature.clone()),
                _ => None,
            }
        };
        let input = parse_input(&format!("sig-pp={params}")).unwrap();
        assert_eq!((input.label.as_str(), input.keyid.as_deref()), ("sig-pp", Some("HTTP_EC_P256_KEY:1")));
        let unsigned = headers(digest.clone(), String::new());
        let request = Received {
            method: "POST",
            authority: "127.0.0.1:8080",
            path: "/v1/notifications/pawapay",
            header: &unsigned,
            body,
        };
        let base = base(&input, &request).unwrap();
        for der in [false, true] {
            let signature: Signature = key.sign(base.as_bytes());
            let bytes = if der { signature.to_der().as_bytes().to_vec() } else { signature.to_bytes().to_vec() };
            let signed = headers(digest.clone(), format!("sig-pp=:{}:", BASE64.encode(&bytes)));
            let good = Received { header: &signed, ..request };
            assert_eq!(verify(&good, &input, key.verifying_key()), Ok(()), "der: {der}");
            let moved = Received { path: "/v1/notifications/other", ..good };
            assert!(verify(&moved, &input, key.verifying_key()).is_err());
            let other_body = Received { body: b"{}", ..good };
            assert!(verify(&other_body, &input, key.verifying_key()).unwrap_err().contains("Content-Digest"));
            let other_key = SigningKey::random(&mut rand::rngs::OsRng);
            assert!(verify(&good, &input, other_key.verifying_key()).is_err());
        }
    }
}
