//! Request head classification (`kvgate::proxy::h1::head::parse`), differentially:
//! - whenever kvgate serves a head itself, an independent httparse parse succeeds with the same
//!   method, target, length and fields, and the forwarded fields are exactly the end-to-end ones;
//! - hyper, given the same bytes, accepts the request and sees the same method, target, body and
//!   fields (kvgate never serves what hyper would reject);
//! - `Partial` only where the head is indeed incomplete.
#![no_main]

use bytes::Bytes;
use http_body_util::BodyExt;
use kvgate::proxy::h1::head::{self, Parsed};
use kvgate::proxy::h1::MAX_HEADERS;
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use std::rc::Rc;
use tokio::io::AsyncWriteExt;

const LIMIT: usize = 4096;
const RID: &[u8] = b"x-request-id";
const HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];
const ENDPOINTS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
];

/// What hyper's server handed its service.
struct Seen {
    method: http::Method,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

thread_local! {
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
}

/// Serves `wire` with hyper's HTTP/1 server over an in-memory pipe; the first request it
/// accepted, if any.
fn hyper_sees(wire: &[u8]) -> Option<Seen> {
    let seen: Rc<RefCell<Option<Seen>>> = Rc::default();
    let record = seen.clone();
    RT.with(|rt| {
        rt.block_on(async {
            let (mut client, server) = tokio::io::duplex(1 << 20);
            client.write_all(wire).await.expect("write");
            client.shutdown().await.expect("shutdown");
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let record = record.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.map(|b| b.to_bytes().to_vec());
                        if record.borrow().is_none() {
                            *record.borrow_mut() = Some(Seen {
                                method: parts.method,
                                target: parts.uri.to_string(),
                                headers: parts
                                    .headers
                                    .iter()
                                    .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                                    .collect(),
                                body: body.unwrap_or_default(),
                            });
                        }
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Empty::<Bytes>::new(),
                        ))
                    }
                });
            let io = hyper_util::rt::TokioIo::new(server);
            // The client has shut its write side: without half-close hyper would drop the
            // request at that end of file before answering it.
            let r = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(io, svc)
                .await;
            if std::env::var_os("FUZZ_DEBUG").is_some() {
                eprintln!("hyper: {r:?} on {:?}", String::from_utf8_lossy(wire));
            }
            drop(client);
        })
    });
    seen.take()
}

fn served(data: &[u8], h: head::Head) {
    // httparse, on its own.
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(data) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!("served, but httparse says {other:?}"),
    };
    assert_eq!(len, h.len);
    assert_eq!(req.method, Some("POST"));
    assert_eq!(req.version, Some(1));
    let target = req.path.expect("target");
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    assert_eq!(path, h.endpoint.path());
    assert!(ENDPOINTS.contains(&path));
    let is = |f: &httparse::Header<'_>, n: &str| f.name.eq_ignore_ascii_case(n);
    let lengths: Vec<_> = req
        .headers
        .iter()
        .filter(|f| is(f, "content-length"))
        .collect();
    assert_eq!(lengths.len(), 1, "one Content-Length");
    let cl = lengths[0].value;
    assert!(
        !cl.is_empty() && cl.iter().all(u8::is_ascii_digit),
        "{cl:?}"
    );
    let n: usize = std::str::from_utf8(cl).unwrap().parse().unwrap();
    assert_eq!(n, h.body_len);
    assert!(n <= LIMIT);
    for bad in ["transfer-encoding", "expect", "upgrade"] {
        assert!(!req.headers.iter().any(|f| is(f, bad)), "served with {bad}");
    }
    let tokens: Vec<Vec<u8>> = req
        .headers
        .iter()
        .filter(|f| is(f, "connection"))
        .flat_map(|f| f.value.split(|&b| b == b','))
        .map(|t| t.trim_ascii().to_ascii_lowercase())
        .collect();
    assert!(!tokens.iter().any(|t| t == b"upgrade"));
    assert_eq!(h.close, tokens.iter().any(|t| t == b"close"));
    let first = |n: &str| {
        req.headers
            .iter()
            .find(|f| is(f, n))
            .map(|f| f.value.to_vec())
    };
    let want_ct = first("content-type");
    let want_rid = first("x-request-id");
    let want_fields: Vec<(Vec<u8>, Vec<u8>)> = req
        .headers
        .iter()
        .filter(|f| {
            let lower = f.name.to_ascii_lowercase();
            !HOP.contains(&lower.as_str())
                && !["host", "content-length", "x-request-id"].contains(&lower.as_str())
                && !tokens.contains(&lower.as_bytes().to_vec())
        })
        .map(|f| (f.name.as_bytes().to_vec(), f.value.to_vec()))
        .collect();
    // `http`'s URI parser (kvgate's and hyper's alike) drops a `#fragment`, which an
    // origin-form target should not carry anyway.
    let target = target.split_once('#').map_or(target, |(t, _)| t);
    let want_query = target.split_once('?').map(|(_, q)| q.to_owned());

    // What kvgate forwards.
    let bytes = Bytes::copy_from_slice(data);
    let body_len = h.body_len;
    let head_len = h.len;
    let end = (head_len + body_len).min(bytes.len());
    let r = head::request(h, bytes.slice(..head_len), bytes.slice(head_len..end));
    let got: Vec<(Vec<u8>, Vec<u8>)> = r
        .fields
        .iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect();
    assert_eq!(got, want_fields, "forwarded fields");
    assert_eq!(r.content_type.map(|v| v.as_bytes().to_vec()), want_ct);
    assert_eq!(r.request_id.map(|v| v.as_bytes().to_vec()), want_rid);
    assert_eq!(
        r.target.as_ref().and_then(|t| t.query()).map(str::to_owned),
        want_query
    );

    // hyper accepts the same request and sees the same thing.
    let mut wire = data[..head_len].to_vec();
    wire.extend(std::iter::repeat_n(b'x', body_len));
    let seen = hyper_sees(&wire).unwrap_or_else(|| {
        panic!(
            "kvgate serves a head hyper rejects: {:?}",
            String::from_utf8_lossy(&wire)
        )
    });
    assert_eq!(seen.method, http::Method::POST);
    assert_eq!(seen.target, target);
    assert_eq!(seen.body.len(), body_len);
    for (n, v) in &want_fields {
        let n = String::from_utf8_lossy(n).to_ascii_lowercase();
        assert!(
            seen.headers.iter().any(|(hn, hv)| *hn == n && hv == v),
            "hyper lost field {n}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    match head::parse(data, LIMIT, RID) {
        Parsed::Serve(h) => served(data, h),
        Parsed::Partial => {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(data) {
                Ok(httparse::Status::Partial) => {}
                other => panic!("Partial, but httparse says {other:?}"),
            }
        }
        Parsed::HandOff => {}
    }
});
