//! Bearer tokens: every call of a served session carries `authorization: Bearer TOKEN`.

use tonic::{Request, Status};

/// The token clients must send, or none (a server on loopback only).
#[derive(Clone)]
pub struct Token(Option<Vec<u8>>);

impl std::fmt::Debug for Token {
    // Never printed, not even in a debug log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Token(set)"
        } else {
            "Token(none)"
        })
    }
}

impl Token {
    pub fn none() -> Self {
        Self(None)
    }

    /// A token from its text (a file's contents: surrounding whitespace and the final newline
    /// are not part of it). Empty is an error, not "no token".
    pub fn new(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("the token is empty".to_string());
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("the token holds whitespace or a control character".to_string());
        }
        Ok(Self(Some(text.as_bytes().to_vec())))
    }

    /// The token's text, for a client that sends it.
    pub fn text(&self) -> Option<&str> {
        self.0.as_deref().and_then(|t| std::str::from_utf8(t).ok())
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Admits a call whose `authorization` header is `Bearer <token>`; refuses any other with
    /// `Unauthenticated`, logging the peer but never what it sent.
    #[allow(clippy::result_large_err)] // tonic's interceptors return its Status as it is.
    pub fn admit<T>(&self, request: Request<T>) -> Result<Request<T>, Status> {
        let Some(expected) = &self.0 else {
            return Ok(request);
        };
        let sent = request
            .metadata()
            .get("authorization")
            .map(|value| value.as_bytes())
            .and_then(|value| {
                value
                    .strip_prefix(b"Bearer ")
                    .or_else(|| value.strip_prefix(b"bearer "))
            });
        match sent {
            Some(sent) if same_bytes(sent, expected) => Ok(request),
            Some(_) => {
                log::warn!("serve: refused a call from {}: wrong token", peer(&request));
                Err(Status::unauthenticated("wrong token"))
            }
            None => {
                log::warn!(
                    "serve: refused a call from {}: no bearer token",
                    peer(&request)
                );
                Err(Status::unauthenticated(
                    "this server needs a token: send the header 'authorization: Bearer TOKEN'",
                ))
            }
        }
    }
}

pub(crate) fn peer<T>(request: &Request<T>) -> String {
    request
        .remote_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|| "an unknown peer".to_string())
}

/// Equality whose time depends on the lengths only, never on where the bytes first differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(header: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(h) = header {
            request
                .metadata_mut()
                .insert("authorization", h.parse().unwrap());
        }
        request
    }

    #[test]
    fn only_the_right_bearer_token_is_admitted() {
        let token = Token::new("s3cret-token\n").unwrap();
        assert!(token.admit(call(Some("Bearer s3cret-token"))).is_ok());
        for refused in [
            None,
            Some("Bearer s3cret-tokem"),
            Some("Bearer s3cret"),
            Some("Basic s3cret-token"),
            Some("s3cret-token"),
        ] {
            let status = token.admit(call(refused)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{refused:?}");
            assert!(!status.message().contains("s3cret"), "{}", status.message());
        }
        assert!(Token::none().admit(call(None)).is_ok());
        assert!(Token::new("  \n").is_err());
        assert!(!format!("{token:?}").contains("s3cret"));
    }
}
