//! The request target. The proxy is a reverse proxy to one upstream, so it
//! serves the origin form only (`/path?query`): an absolute-form target
//! (`GET http://x/ HTTP/1.1`, what a client sends to a forward proxy), the
//! authority form of `CONNECT` and the asterisk of `OPTIONS *` get 400. Every
//! target hyper accepts reaches [`origin_form`], which never panics; the fuzz
//! target `proxy/fuzz/fuzz_targets/request_target.rs` and the corpus test
//! (`proxy/tests/target_corpus.rs`) feed it arbitrary bytes.

use http::uri::PathAndQuery;
use http::Uri;

/// Why a request target is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// `scheme://authority/...`: forward-proxy style.
    #[error("absolute-form request target {0:?}: this proxy forwards only to its upstream; send the path (origin form)")]
    Absolute(String),
    /// `host:port` (`CONNECT`).
    #[error("authority-form request target {0:?}: this proxy does not tunnel")]
    Authority(String),
    /// Anything else that is not `/...`, such as `*`.
    #[error("request target {0:?} is not a path starting with /")]
    NotAPath(String),
}

/// The longest target quoted back in an error.
const QUOTED: usize = 200;

fn quoted(uri: &Uri) -> String {
    let s = uri.to_string();
    match s.char_indices().nth(QUOTED) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

/// The request's target in origin form, the form sent upstream; an error
/// for any other form.
pub fn origin_form(uri: &Uri) -> Result<PathAndQuery, TargetError> {
    if uri.scheme().is_some() {
        return Err(TargetError::Absolute(quoted(uri)));
    }
    if uri.authority().is_some() {
        return Err(TargetError::Authority(quoted(uri)));
    }
    match uri.path_and_query() {
        Some(pq) if pq.path().starts_with('/') => Ok(pq.clone()),
        _ => Err(TargetError::NotAPath(quoted(uri))),
    }
}

/// What the proxy does with the raw bytes of a request target: parse them as
/// hyper does, then take the origin form. For fuzzing and the corpus test;
/// `None` when the bytes are no URI at all (hyper answers those 400 itself).
pub fn check_raw(target: &[u8]) -> Option<Result<PathAndQuery, TargetError>> {
    let uri = Uri::try_from(target).ok()?;
    let result = origin_form(&uri);
    if let Ok(pq) = &result {
        // What goes upstream must itself be a valid origin-form target, and
        // routing on it must not panic either.
        let again: Uri = pq.as_str().parse().ok()?;
        assert_eq!(again.path(), pq.path());
        let _ = crate::api::is_reserved(pq.path());
        let _ = crate::is_turn_boundary(&http::Method::POST, pq.as_str());
    }
    Some(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(s: &str) -> Result<PathAndQuery, TargetError> {
        origin_form(&s.parse().unwrap())
    }

    #[test]
    fn origin_form_passes_unchanged() {
        assert_eq!(
            of("/v1/messages?beta=1").unwrap().as_str(),
            "/v1/messages?beta=1"
        );
        assert_eq!(of("/").unwrap().as_str(), "/");
    }

    #[test]
    fn other_forms_are_refused() {
        // The line that panicked the handler before: no path, a query.
        assert!(matches!(of("http://x?y"), Err(TargetError::Absolute(_))));
        assert!(matches!(
            of("http://evil.example/v1/messages"),
            Err(TargetError::Absolute(_))
        ));
        assert!(matches!(of("x:443"), Err(TargetError::Authority(_))));
        assert!(matches!(of("*"), Err(TargetError::NotAPath(_))));
    }

    #[test]
    fn a_long_target_is_quoted_short() {
        let long = format!("http://x/{}", "a".repeat(10_000));
        let e = of(&long).unwrap_err().to_string();
        assert!(e.len() < 400, "{}", e.len());
    }
}
