//! `[jwt]`: how the gateway verifies the JSON Web Tokens a route's `jwt:CLAIM`
//! identity is taken from — an HMAC secret (HS256/384/512), a public key
//! (RS256/384/512, PS256/384/512, ES256, ES384) or a JWKS file — with the
//! expiry always checked, and the issuer and audience when set. A claim of a
//! token that does not verify is never an identity.

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use toml::Spanned;

use super::Report;

/// `[jwt]` as written.
#[derive(Debug, Deserialize)]
pub(super) struct Raw {
    secret_file: Option<Spanned<String>>,
    public_key: Option<Spanned<String>>,
    jwks_file: Option<Spanned<String>>,
    issuer: Option<Spanned<String>>,
    audience: Option<Spanned<String>>,
    header: Option<Spanned<String>>,
    leeway: Option<Spanned<String>>,
}

/// A key tokens may be signed with: its `kid`, and the algorithms it
/// verifies.
struct Key {
    id: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

/// The keys a token may be signed with, and what else it must say.
#[derive(Clone)]
pub struct Jwt {
    keys: Arc<[Key]>,
    validation: Validation,
    /// The header the token comes in (`Authorization: Bearer …` by default).
    pub header: http::HeaderName,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt")
            .field("keys", &self.keys.len())
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// Why a token was refused (never its content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl Jwt {
    /// The claim `name` of the token `text` (a string, or a number as
    /// written), once its signature, expiry, issuer and audience verify;
    /// `Ok(None)` when it verifies but has no such claim.
    pub fn claim(&self, text: &str, name: &str) -> Result<Option<String>, Refused> {
        let header = jsonwebtoken::decode_header(text).map_err(|e| Refused(e.to_string()))?;
        let key = match &header.kid {
            Some(kid) => self.keys.iter().find(|k| k.id.as_deref() == Some(kid)),
            None => self.keys.first().filter(|_| self.keys.len() == 1),
        };
        let Some(Key {
            key, algorithms, ..
        }) = key
        else {
            return Err(Refused("no key for the token's `kid`".into()));
        };
        if !algorithms.contains(&header.alg) {
            return Err(Refused(format!(
                "{:?} is not an algorithm of its key",
                header.alg
            )));
        }
        let mut validation = self.validation.clone();
        validation.algorithms = vec![header.alg];
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            text,
            key,
            &validation,
        )
        .map_err(|e| Refused(e.to_string()))?;
        Ok(match data.claims.get(name) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        })
    }
}

/// The algorithms of a public key: RSA's, or EC's (a signature made for
/// another curve than the key's does not verify).
fn public(pem: &[u8]) -> Option<Key> {
    use Algorithm::*;
    let (key, algorithms) = match DecodingKey::from_rsa_pem(pem) {
        Ok(key) => (key, vec![RS256, RS384, RS512, PS256, PS384, PS512]),
        Err(_) => (DecodingKey::from_ec_pem(pem).ok()?, vec![ES256, ES384]),
    };
    Some(Key {
        id: None,
        key,
        algorithms,
    })
}

/// The keys of a JWKS document (`{"keys": [...]}`).
fn jwks(text: &str) -> Result<Vec<Key>, String> {
    let set: jsonwebtoken::jwk::JwkSet = serde_json::from_str(text).map_err(|e| e.to_string())?;
    set.keys
        .iter()
        .map(|jwk| {
            let key = DecodingKey::from_jwk(jwk).map_err(|e| e.to_string())?;
            let algorithms = match jwk
                .common
                .key_algorithm
                .and_then(|a| a.to_string().parse::<Algorithm>().ok())
            {
                Some(alg) => vec![alg],
                None => match &jwk.algorithm {
                    jsonwebtoken::jwk::AlgorithmParameters::RSA(_) => {
                        vec![Algorithm::RS256, Algorithm::RS384, Algorithm::RS512]
                    }
                    jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                        jsonwebtoken::jwk::EllipticCurve::P384 => vec![Algorithm::ES384],
                        _ => vec![Algorithm::ES256],
                    },
                    _ => vec![Algorithm::EdDSA],
                },
            };
            Ok(Key {
                id: jwk.common.key_id.clone(),
                key,
                algorithms,
            })
        })
        .collect()
}

pub(super) fn parse(raw: Raw, report: &mut Report<'_>) -> Option<Jwt> {
    let given = [
        ("secret_file", &raw.secret_file),
        ("public_key", &raw.public_key),
        ("jwks_file", &raw.jwks_file),
    ];
    let set: Vec<(&str, &Spanned<String>)> = given
        .iter()
        .filter_map(|(key, value)| value.as_ref().map(|v| (*key, v)))
        .collect();
    let [(key, path)] = set.as_slice() else {
        let span = set.get(1).map_or(0..0, |(_, v)| v.span());
        report.error(
            &span,
            "[jwt]",
            "give one of secret_file (HS256), public_key (RS256, ES256: a PEM file) and jwks_file",
        );
        return None;
    };
    let place = format!("[jwt] {key}");
    let read = match std::fs::read(path.get_ref()) {
        Ok(bytes) => bytes,
        Err(e) => {
            report.error(
                &path.span(),
                &place,
                format!("cannot read `{}`: {e}", path.get_ref()),
            );
            return None;
        }
    };
    let keys = match *key {
        "secret_file" => {
            // Its first line: a trailing newline is not the secret's.
            let secret = String::from_utf8_lossy(&read)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned();
            if secret.len() < 32 {
                report.error(
                    &path.span(),
                    &place,
                    "a secret of at least 32 bytes (openssl rand -hex 32)",
                );
                return None;
            }
            Ok(vec![Key {
                id: None,
                key: DecodingKey::from_secret(secret.as_bytes()),
                algorithms: vec![Algorithm::HS256, Algorithm::HS384, Algorithm::HS512],
            }])
        }
        "public_key" => public(&read)
            .map(|key| vec![key])
            .ok_or_else(|| format!("`{}` is not an RSA or EC public key in PEM", path.get_ref())),
        _ => jwks(&String::from_utf8_lossy(&read))
            .map_err(|e| format!("`{}` is not a JWKS: {e}", path.get_ref())),
    };
    let keys = match keys {
        Ok(keys) if !keys.is_empty() => keys,
        Ok(_) => {
            report.error(&path.span(), &place, "holds no key");
            return None;
        }
        Err(message) => {
            report.error(&path.span(), &place, message);
            return None;
        }
    };
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_required_spec_claims(&["exp"]);
    validation.validate_nbf = true;
    let leeway = super::duration(
        raw.leeway.as_ref(),
        Duration::from_secs(30),
        "[jwt] leeway",
        report,
    );
    validation.leeway = leeway.as_secs();
    if let Some(issuer) = &raw.issuer {
        validation.set_issuer(&[issuer.get_ref()]);
    }
    match &raw.audience {
        Some(audience) => validation.set_audience(&[audience.get_ref()]),
        None => validation.validate_aud = false,
    }
    let header = match &raw.header {
        None => http::header::AUTHORIZATION,
        Some(h) => match http::HeaderName::try_from(h.get_ref().as_str()) {
            Ok(name) => name,
            Err(_) => {
                report.error(
                    &h.span(),
                    "[jwt] header",
                    format!("`{}` is not a header name", h.get_ref()),
                );
                http::header::AUTHORIZATION
            }
        },
    };
    Some(Jwt {
        keys: keys.into(),
        validation,
        header,
    })
}
