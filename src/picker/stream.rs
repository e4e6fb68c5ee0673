//! One ext_proc stream's request side, without I/O: the request headers and the body chunks
//! the gateway streams in (FULL_DUPLEX_STREAMED), gathered under the body limit until the
//! request is complete and can be routed.
//!
//! Invariants:
//! - The body held never exceeds the limit: the chunk that would pass it is refused whole
//!   ([`Step::TooLarge`]) and nothing more is kept.
//! - [`Step::Route`] is returned once per stream, at the first end of the request (headers with
//!   `end_of_stream`, the last body chunk, or trailers); messages out of that order are
//!   [`Step::OutOfOrder`].

use super::protocol::header_value;
use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders};
use http::{HeaderMap, HeaderName, HeaderValue};

/// Where the request side is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the request headers.
    Headers,
    /// Headers seen; body chunks arriving.
    Body,
    /// The request is complete and was handed on for routing.
    Routed,
}

/// What the caller does after a message.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to answer yet.
    Wait,
    /// The request is complete: route it (see [`Request::take`]).
    Route,
    /// The body passed the limit.
    TooLarge,
    /// A message the protocol does not allow here.
    OutOfOrder(&'static str),
}

/// The request as gathered.
#[derive(Debug)]
pub struct Request {
    phase: Phase,
    limit: usize,
    /// `:path`, without the query.
    pub path: String,
    /// `:method`.
    pub method: String,
    /// The regular (non-pseudo) headers, as the client sent them through the gateway.
    pub headers: HeaderMap,
    body: BytesMut,
    /// Trailers arrived (they are answered after the body).
    pub trailers: bool,
    /// The headers did not end the request: a body (possibly empty) was streamed and is to be
    /// passed back.
    pub bodied: bool,
}

impl Request {
    /// A stream whose body may hold at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            phase: Phase::Headers,
            limit,
            path: String::new(),
            method: String::new(),
            headers: HeaderMap::new(),
            body: BytesMut::new(),
            trailers: false,
            bodied: false,
        }
    }

    /// The request headers arrived.
    pub fn on_headers(&mut self, h: &HttpHeaders) -> Step {
        if self.phase != Phase::Headers {
            return Step::OutOfOrder("request headers twice");
        }
        for hv in h.headers.iter().flat_map(|m| m.headers.iter()) {
            let v = header_value(hv);
            match hv.key.as_str() {
                ":path" => {
                    let p = String::from_utf8_lossy(v);
                    self.path = p.split('?').next().unwrap_or_default().to_string();
                }
                ":method" => self.method = String::from_utf8_lossy(v).into_owned(),
                k if k.starts_with(':') => {}
                k => {
                    // A field that is not valid HTTP is not one the routing reads.
                    if let (Ok(n), Ok(v)) = (
                        HeaderName::from_bytes(k.as_bytes()),
                        HeaderValue::from_bytes(v),
                    ) {
                        self.headers.append(n, v);
                    }
                }
            }
        }
        if h.end_of_stream {
            self.phase = Phase::Routed;
            Step::Route
        } else {
            self.phase = Phase::Body;
            self.bodied = true;
            Step::Wait
        }
    }

    /// A request body chunk arrived.
    pub fn on_body(&mut self, b: &HttpBody) -> Step {
        if self.phase != Phase::Body {
            return Step::OutOfOrder("request body outside the request");
        }
        if self.body.len() + b.body.len() > self.limit {
            self.body = BytesMut::new();
            self.phase = Phase::Routed;
            return Step::TooLarge;
        }
        self.body.extend_from_slice(&b.body);
        if b.end_of_stream {
            self.phase = Phase::Routed;
            Step::Route
        } else {
            Step::Wait
        }
    }

    /// Request trailers arrived: the request is complete if the body did not say so.
    pub fn on_trailers(&mut self) -> Step {
        self.trailers = true;
        match self.phase {
            Phase::Body => {
                self.phase = Phase::Routed;
                Step::Route
            }
            Phase::Headers => Step::OutOfOrder("request trailers before headers"),
            // Already routed (the body ended first): answered after the body.
            Phase::Routed => Step::Wait,
        }
    }

    /// Bytes of body held now.
    pub fn held(&self) -> usize {
        self.body.len()
    }

    /// The whole body, taken out.
    pub fn take(&mut self) -> Bytes {
        std::mem::take(&mut self.body).freeze()
    }

    /// Whether the request was complete and handed on.
    pub fn routed(&self) -> bool {
        self.phase == Phase::Routed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{HeaderMap as PbMap, HeaderValue as PbValue};

    fn headers(eos: bool) -> HttpHeaders {
        HttpHeaders {
            headers: Some(PbMap {
                headers: vec![
                    PbValue {
                        key: ":path".into(),
                        value: String::new(),
                        raw_value: b"/v1/chat/completions?x=1".to_vec(),
                    },
                    PbValue {
                        key: "content-type".into(),
                        value: "application/json".into(),
                        raw_value: Vec::new(),
                    },
                ],
            }),
            end_of_stream: eos,
            ..Default::default()
        }
    }

    fn body(b: &[u8], eos: bool) -> HttpBody {
        HttpBody {
            body: b.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        }
    }

    #[test]
    fn chunks_gather_until_the_end() {
        let mut r = Request::new(10);
        assert_eq!(r.on_headers(&headers(false)), Step::Wait);
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(r.headers["content-type"], "application/json");
        assert_eq!(r.on_body(&body(b"abc", false)), Step::Wait);
        assert_eq!(r.on_body(&body(b"def", true)), Step::Route);
        assert_eq!(r.take(), Bytes::from_static(b"abcdef"));
        assert_eq!(
            r.on_body(&body(b"x", true)),
            Step::OutOfOrder("request body outside the request")
        );
        assert_eq!(r.on_trailers(), Step::Wait);
    }

    #[test]
    fn the_limit_holds() {
        let mut r = Request::new(4);
        r.on_headers(&headers(false));
        assert_eq!(r.on_body(&body(b"abcd", false)), Step::Wait);
        assert_eq!(r.on_body(&body(b"e", true)), Step::TooLarge);
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn headers_only_and_trailers_end_the_request() {
        let mut r = Request::new(4);
        assert_eq!(r.on_headers(&headers(true)), Step::Route);
        let mut r = Request::new(4);
        r.on_headers(&headers(false));
        r.on_body(&body(b"ab", false));
        assert_eq!(r.on_trailers(), Step::Route);
        assert!(r.trailers);
    }
}
