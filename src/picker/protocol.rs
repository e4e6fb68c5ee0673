//! The endpoint picker protocol's names and messages, in one place: what the Gateway API
//! Inference Extension's "Endpoint Picker Protocol" (GIE [`GIE_VERSION`], protocol
//! [`PROTOCOL_VERSION`]) calls its header, metadata namespaces and keys, and builders for the
//! ext_proc messages the picker sends. Pure: no I/O, no state.
//!
//! Invariants:
//! - The destination is named identically in the header and in the dynamic metadata (the
//!   protocol forbids two different values): the chosen endpoint first, then the fallbacks,
//!   comma-separated, each `ip:port`.
//! - The destination header overwrites any the client sent (a client cannot pick its endpoint).
//! - A body passed back in FULL_DUPLEX_STREAMED mode is cut into chunks of at most
//!   [`MAX_BODY_CHUNK`] bytes; only the last carries `end_of_stream`.

use envoy_types::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, processing_response::Response, BodyMutation, BodyResponse,
    CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse, ProcessingResponse,
    StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// The Gateway API Inference Extension release whose protocol this picker follows.
pub const GIE_VERSION: &str = "v1.6.0";
/// The Endpoint Picker Protocol version (docs/proposals/004-endpoint-picker-protocol) in
/// that release.
pub const PROTOCOL_VERSION: &str = "v1.0.0";
/// The gRPC service the picker serves.
pub const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";
/// The request header naming the destination endpoint(s).
pub const DESTINATION_ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";
/// The dynamic metadata namespace the destination is written under.
pub const DESTINATION_ENDPOINT_NAMESPACE: &str = "envoy.lb";
/// The dynamic metadata key of the destination endpoint(s).
pub const DESTINATION_ENDPOINT_KEY: &str = "x-gateway-destination-endpoint";
/// The filter metadata key, under [`DESTINATION_ENDPOINT_NAMESPACE`], by which the gateway
/// reports the endpoint that served the request.
pub const DESTINATION_ENDPOINT_SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// The filter metadata namespace of the subset the gateway restricts the choice to.
pub const SUBSET_HINT_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The filter metadata key of that subset (a list of `ip:port`).
pub const SUBSET_HINT_KEY: &str = "x-gateway-destination-endpoint-subset";
/// Health services (gRPC health checking protocol) the protocol names, besides
/// [`EXT_PROC_SERVICE`].
pub const HEALTH_LIVENESS: &str = "liveness";
/// See [`HEALTH_LIVENESS`].
pub const HEALTH_READINESS: &str = "readiness";
/// Largest body chunk passed back in one message: some gateways limit a streamed chunk to
/// 64 KiB; the reference picker uses this margin.
pub const MAX_BODY_CHUNK: usize = 62_000;

/// A header's value: `raw_value` when set (Envoy sends that), else `value`.
pub fn header_value(h: &HeaderValue) -> &[u8] {
    if h.raw_value.is_empty() {
        h.value.as_bytes()
    } else {
        &h.raw_value
    }
}

/// One header set on the request, overwriting any of the same name.
fn set_header(key: &str, value: Vec<u8>) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            value: String::new(),
            raw_value: value,
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

fn string_value(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

/// The dynamic metadata naming `destination`: `{"envoy.lb": {"x-gateway-destination-endpoint":
/// destination}}`.
pub fn destination_metadata(destination: &str) -> Struct {
    let inner = Struct {
        fields: [(
            DESTINATION_ENDPOINT_KEY.to_string(),
            string_value(destination.to_string()),
        )]
        .into(),
    };
    Struct {
        fields: [(
            DESTINATION_ENDPOINT_NAMESPACE.to_string(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into(),
    }
}

/// The answer to the request headers once the endpoint is chosen: the destination header (and
/// `content-length` when the body is passed back, and the `extra` headers, e.g. the request id
/// the decision was logged under), the fields in `remove` removed, the route cache cleared so
/// that the gateway routes on the new header, and the destination metadata.
pub fn destination_response(
    destination: &str,
    content_length: Option<usize>,
    remove: &[String],
    extra: &[(&str, &[u8])],
) -> ProcessingResponse {
    let mut set = vec![set_header(
        DESTINATION_ENDPOINT_HEADER,
        destination.as_bytes().to_vec(),
    )];
    if let Some(n) = content_length {
        set.push(set_header("content-length", n.to_string().into_bytes()));
    }
    set.extend(extra.iter().map(|(k, v)| set_header(k, v.to_vec())));
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers: set,
                    remove_headers: remove.to_vec(),
                }),
                clear_route_cache: true,
                ..Default::default()
            }),
        })),
        dynamic_metadata: Some(destination_metadata(destination)),
        ..Default::default()
    }
}

/// `body` passed back as streamed body responses, on the request side (`request`) or the
/// response side; the last chunk carries `end_of_stream` when `eos`. An empty body is one
/// empty chunk.
pub fn body_chunks(body: &[u8], eos: bool, request: bool, out: &mut Vec<ProcessingResponse>) {
    let mut chunks = body.chunks(MAX_BODY_CHUNK).peekable();
    if body.is_empty() {
        out.push(body_message(Vec::new(), eos, request));
        return;
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        out.push(body_message(c.to_vec(), eos && last, request));
    }
}

fn body_message(body: Vec<u8>, end_of_stream: bool, request: bool) -> ProcessingResponse {
    let r = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                    body,
                    end_of_stream,
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }),
    };
    ProcessingResponse {
        response: Some(if request {
            Response::RequestBody(r)
        } else {
            Response::ResponseBody(r)
        }),
        ..Default::default()
    }
}

/// The answer to the response headers: continue, with the `set` headers set (none: unchanged).
pub fn response_headers_continue(set: &[(&str, &[u8])]) -> ProcessingResponse {
    let header_mutation = (!set.is_empty()).then(|| HeaderMutation {
        set_headers: set.iter().map(|(k, v)| set_header(k, v.to_vec())).collect(),
        remove_headers: Vec::new(),
    });
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation,
                ..Default::default()
            }),
        })),
        ..Default::default()
    }
}

/// The answer to request (`request`) or response trailers: continue unchanged.
pub fn trailers_continue(request: bool) -> ProcessingResponse {
    let t = TrailersResponse::default();
    ProcessingResponse {
        response: Some(if request {
            Response::RequestTrailers(t)
        } else {
            Response::ResponseTrailers(t)
        }),
        ..Default::default()
    }
}

/// The gateway answers the client itself, with `status`, `headers` and `body`; `details` is
/// for the gateway's logs.
pub fn immediate(
    status: u16,
    headers: &[(String, Vec<u8>)],
    body: Vec<u8>,
    details: &str,
) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(status),
            }),
            headers: Some(HeaderMutation {
                set_headers: headers
                    .iter()
                    .map(|(k, v)| set_header(k, v.clone()))
                    .collect(),
                remove_headers: Vec::new(),
            }),
            body,
            grpc_status: None,
            details: details.to_string(),
        })),
        ..Default::default()
    }
}

fn namespace<'a>(md: Option<&'a Metadata>, ns: &str) -> Option<&'a Struct> {
    md?.filter_metadata.get(ns)
}

/// The endpoint the gateway reports as having served the request, if it does.
pub fn served_endpoint(md: Option<&Metadata>) -> Option<&str> {
    let v = namespace(md, DESTINATION_ENDPOINT_NAMESPACE)?
        .fields
        .get(DESTINATION_ENDPOINT_SERVED_KEY)?;
    match &v.kind {
        Some(Kind::StringValue(s)) => Some(s.as_str()),
        _ => None,
    }
}

/// The subset of endpoints the gateway restricts the choice to, if it sets one (an empty list
/// allows none).
pub fn subset_hint(md: Option<&Metadata>) -> Option<Vec<&str>> {
    let v = namespace(md, SUBSET_HINT_NAMESPACE)?
        .fields
        .get(SUBSET_HINT_KEY)?;
    match &v.kind {
        Some(Kind::ListValue(l)) => Some(
            l.values
                .iter()
                .filter_map(|v| match &v.kind {
                    Some(Kind::StringValue(s)) => Some(s.as_str()),
                    _ => None,
                })
                .collect(),
        ),
        // A single endpoint as a string, or comma-separated.
        Some(Kind::StringValue(s)) => Some(s.split(',').map(str::trim).collect()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_chunked_with_one_end() {
        let body = vec![b'x'; MAX_BODY_CHUNK * 2 + 5];
        let mut out = Vec::new();
        body_chunks(&body, true, true, &mut out);
        assert_eq!(out.len(), 3);
        let eos: Vec<bool> = out
            .iter()
            .map(|m| match &m.response {
                Some(Response::RequestBody(b)) => match b
                    .response
                    .as_ref()
                    .and_then(|c| c.body_mutation.as_ref())
                    .and_then(|m| m.mutation.as_ref())
                {
                    Some(Mutation::StreamedResponse(s)) => s.end_of_stream,
                    _ => panic!("not streamed"),
                },
                _ => panic!("not a request body"),
            })
            .collect();
        assert_eq!(eos, vec![false, false, true]);
        let mut out = Vec::new();
        body_chunks(b"", true, false, &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn served_and_subset_are_read() {
        let mut md = Metadata::default();
        let served = Struct {
            fields: [(
                DESTINATION_ENDPOINT_SERVED_KEY.to_string(),
                string_value("10.0.0.2:8000".into()),
            )]
            .into(),
        };
        md.filter_metadata
            .insert(DESTINATION_ENDPOINT_NAMESPACE.to_string(), served);
        let list = Value {
            kind: Some(Kind::ListValue(
                envoy_types::pb::google::protobuf::ListValue {
                    values: vec![string_value("10.0.0.1:8000".into())],
                },
            )),
        };
        md.filter_metadata.insert(
            SUBSET_HINT_NAMESPACE.to_string(),
            Struct {
                fields: [(SUBSET_HINT_KEY.to_string(), list)].into(),
            },
        );
        assert_eq!(served_endpoint(Some(&md)), Some("10.0.0.2:8000"));
        assert_eq!(subset_hint(Some(&md)), Some(vec!["10.0.0.1:8000"]));
        assert_eq!(served_endpoint(None), None);
    }
}
