//! What a proxied request answers: an instance's answer relayed, or one kvgate made (an error).
//!
//! Invariants:
//! - A relayed answer keeps the instance's status and end-to-end fields as received; kvgate's
//!   own fields (`x-request-id`, `x-kvgate-*`) replace any of the same name from the instance.
//! - A reply carries no framing: whoever writes it frames the body.

use super::body::GatewayBody;
use crate::client::wire::Fields;
use http::header::{HeaderName, HeaderValue};
use http::StatusCode;

/// kvgate's own fields on a relayed answer: request id and the three `x-kvgate-*`.
const OWN_FIELDS: usize = 4;

/// The answer to a proxied request.
pub enum Reply {
    /// An instance's answer.
    Relayed {
        /// The instance's status.
        status: StatusCode,
        /// The instance's end-to-end fields.
        fields: Fields,
        /// kvgate's fields, written after the instance's.
        own: Vec<(HeaderName, HeaderValue)>,
        /// The instance's body, tracked.
        body: GatewayBody,
    },
    /// An answer kvgate made.
    Made(http::Response<GatewayBody>),
}

impl Reply {
    /// A relayed answer with room for kvgate's fields.
    pub fn relayed(status: StatusCode, fields: Fields, body: GatewayBody) -> Self {
        Reply::Relayed {
            status,
            fields,
            own: Vec::with_capacity(OWN_FIELDS),
            body,
        }
    }

    /// Sets one of kvgate's own fields, replacing any field of that name.
    pub fn set(&mut self, name: HeaderName, value: HeaderValue) {
        match self {
            Reply::Relayed { own, .. } => match own.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value,
                None => own.push((name, value)),
            },
            Reply::Made(resp) => {
                resp.headers_mut().insert(name, value);
            }
        }
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        match self {
            Reply::Relayed { status, .. } => *status,
            Reply::Made(resp) => resp.status(),
        }
    }

    /// As an `http` response, for hyper and axum.
    pub fn into_http(self) -> http::Response<GatewayBody> {
        match self {
            Reply::Relayed {
                status,
                fields,
                own,
                body,
            } => {
                let mut resp = http::Response::new(body);
                *resp.status_mut() = status;
                let headers = resp.headers_mut();
                *headers = fields.to_header_map();
                for (name, value) in own {
                    headers.insert(name, value);
                }
                resp
            }
            Reply::Made(resp) => resp,
        }
    }

    /// Whether an instance's field named `name` is replaced by one of kvgate's.
    pub fn is_own(own: &[(HeaderName, HeaderValue)], name: &[u8]) -> bool {
        own.iter()
            .any(|(n, _)| n.as_str().as_bytes().eq_ignore_ascii_case(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::wire::parse_head;
    use bytes::BytesMut;
    use http::Method;

    fn fields(head: &str) -> Fields {
        let mut buf = BytesMut::from(head.as_bytes());
        parse_head(&mut buf, &Method::POST).unwrap().unwrap().fields
    }

    #[test]
    fn own_fields_replace_the_instances() {
        let f = fields(
            "HTTP/1.1 200 OK\r\nX-Request-Id: theirs\r\nx-a: 1\r\ncontent-length: 0\r\n\r\n",
        );
        let body = GatewayBody::plain(axum::body::Body::empty());
        let mut r = Reply::relayed(StatusCode::OK, f, body);
        let rid = HeaderName::from_static("x-request-id");
        r.set(rid.clone(), HeaderValue::from_static("one"));
        r.set(rid.clone(), HeaderValue::from_static("ours"));
        if let Reply::Relayed { own, .. } = &r {
            assert_eq!(own.len(), 1);
            assert!(Reply::is_own(own, b"X-REQUEST-ID"));
            assert!(!Reply::is_own(own, b"x-a"));
        }
        let resp = r.into_http();
        assert_eq!(resp.headers().get_all("x-request-id").iter().count(), 1);
        assert_eq!(resp.headers()["x-request-id"], "ours");
        assert_eq!(resp.headers()["x-a"], "1");
    }
}
