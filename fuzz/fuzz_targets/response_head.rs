//! The upstream response head parser (`kvgate::client::wire::parse_head`) against httparse used
//! on its own: it completes exactly when httparse does (within the bounds), the status and the
//! end-to-end fields are httparse's, and the framing follows RFC 9112 §6.3 with a strict
//! `Content-Length` (digits only, repeats equal).
#![no_main]

use bytes::BytesMut;
use http::Method;
use kvgate::client::wire::{parse_head, Framing, WireError, MAX_HEADERS, MAX_HEAD_BYTES};
use libfuzzer_sys::fuzz_target;

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

fuzz_target!(|data: &[u8]| {
    let Some((&sel, wire)) = data.split_first() else {
        return;
    };
    let method = if sel & 1 == 0 {
        Method::POST
    } else {
        Method::HEAD
    };
    let mut buf = BytesMut::from(wire);
    let got = parse_head(&mut buf, &method);

    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let theirs = resp.parse(wire);
    let head = match (got, theirs) {
        (Ok(None), Ok(httparse::Status::Partial)) => return,
        (Err(WireError::TooLarge), Ok(httparse::Status::Partial)) => {
            assert!(wire.len() >= MAX_HEAD_BYTES);
            return;
        }
        (Err(WireError::TooLarge), Err(httparse::Error::TooManyHeaders)) => return,
        (Err(_), Err(_)) => return,
        (Ok(Some(h)), Ok(httparse::Status::Complete(n))) => {
            assert_eq!(
                buf.len(),
                wire.len() - n,
                "the head is cut off, the rest stays"
            );
            assert_eq!(&buf[..], &wire[n..]);
            h
        }
        (Err(e), Ok(httparse::Status::Complete(_))) => {
            // Rejecting a complete head is right only for what the framing rules forbid.
            let lengths: Vec<&[u8]> = resp
                .headers
                .iter()
                .filter(|f| f.name.eq_ignore_ascii_case("content-length"))
                .map(|f| f.value)
                .collect();
            let strict_ok = lengths.iter().all(|v| strict_len(v).is_some())
                && lengths
                    .windows(2)
                    .all(|w| strict_len(w[0]) == strict_len(w[1]));
            let status_ok = resp
                .code
                .is_some_and(|c| http::StatusCode::from_u16(c).is_ok());
            assert!(
                !strict_ok || !status_ok,
                "rejected a valid head ({e}): {:?}",
                String::from_utf8_lossy(wire)
            );
            return;
        }
        (got, theirs) => panic!(
            "parse_head {:?} vs httparse {theirs:?}: {:?}",
            got.map(|h| h.map(|h| h.status)),
            String::from_utf8_lossy(wire)
        ),
    };
    let code = resp.code.expect("code");
    assert_eq!(head.status.as_u16(), code);
    let is = |f: &httparse::Header<'_>, n: &str| f.name.eq_ignore_ascii_case(n);
    let tokens: Vec<Vec<u8>> = resp
        .headers
        .iter()
        .filter(|f| is(f, "connection"))
        .flat_map(|f| f.value.split(|&b| b == b','))
        .map(|t| t.trim_ascii().to_ascii_lowercase())
        .collect();
    let want: Vec<(Vec<u8>, Vec<u8>)> = resp
        .headers
        .iter()
        .filter(|f| {
            let lower = f.name.to_ascii_lowercase();
            !HOP.contains(&lower.as_str()) && !tokens.contains(&lower.as_bytes().to_vec())
        })
        .map(|f| (f.name.as_bytes().to_vec(), f.value.to_vec()))
        .collect();
    let fields: Vec<(Vec<u8>, Vec<u8>)> = head
        .fields
        .iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect();
    assert_eq!(fields, want, "end-to-end fields");

    // Framing, RFC 9112 §6.3.
    let te: Vec<&[u8]> = resp
        .headers
        .iter()
        .filter(|f| is(f, "transfer-encoding"))
        .map(|f| f.value)
        .collect();
    let lengths: Vec<u64> = resp
        .headers
        .iter()
        .filter(|f| is(f, "content-length"))
        .map(|f| {
            strict_len(f.value).unwrap_or_else(|| {
                panic!(
                    "accepted Content-Length {:?}",
                    String::from_utf8_lossy(f.value)
                )
            })
        })
        .collect();
    assert!(
        lengths.windows(2).all(|w| w[0] == w[1]),
        "conflicting lengths accepted"
    );
    let bodiless =
        method == Method::HEAD || (100..200).contains(&code) || code == 204 || code == 304;
    let want_framing = if bodiless {
        Framing::Empty
    } else if let Some(last) = te.last() {
        let coding = last.rsplit(|&b| b == b',').next().unwrap_or_default();
        if coding.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else {
        match lengths.first() {
            Some(0) => Framing::Empty,
            Some(&n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    };
    assert_eq!(head.framing, want_framing);
    let close = if resp.version == Some(1) {
        tokens.iter().any(|t| t == b"close")
    } else {
        !tokens.iter().any(|t| t == b"keep-alive") || tokens.iter().any(|t| t == b"close")
    };
    assert_eq!(
        head.reusable,
        !close && want_framing != Framing::UntilClose && code != 101
    );
});

/// `Content-Length = 1*DIGIT` (RFC 9110 §8.6), blanks around allowed (field values are trimmed).
fn strict_len(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}
