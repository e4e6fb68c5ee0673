//! The Kubernetes watch stream (`kvgate_discovery::kubernetes`): line splitting gives the same
//! lines however the stream is cut into chunks, equal to the reference over the whole stream, and
//! never holds a line past its limit; every line, applied to a reflector, is an event or an
//! error, never a panic, and the reflector never tracks more objects than its bound.
#![no_main]

use arbitrary::Arbitrary;
use kvgate_discovery::kubernetes::lines::LineBuffer;
use kvgate_discovery::kubernetes::objects::{EndpointSlice, Pod};
use kvgate_discovery::kubernetes::reflector::Reflector;
use kvgate_fuzz::{lines, splits};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    cuts: Vec<u8>,
    max_line: u16,
    max_objects: u8,
    stream: &'a [u8],
}

fuzz_target!(|input: Input<'_>| {
    let max = usize::from(input.max_line);
    let want = lines::complete_lines(input.stream, max);
    let mut buf = LineBuffer::new(max);
    let mut got = Vec::new();
    let mut failed = false;
    for piece in splits::pieces(input.stream, &input.cuts) {
        match buf.push(piece) {
            Ok(ls) => got.extend(ls),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    match &want {
        Some(w) => {
            assert!(!failed, "a line within {max} bytes was refused");
            assert_eq!(&got, w, "cut at {:?}", input.cuts);
        }
        None => {
            assert!(failed, "a line over {max} bytes was accepted");
            assert!(got.iter().all(|l| l.len() <= max));
        }
    }
    let bound = usize::from(input.max_objects);
    let mut pods: Reflector<Pod> = Reflector::new(bound);
    let mut slices: Reflector<EndpointSlice> = Reflector::new(bound);
    for line in &got {
        let _ = pods.apply(line);
        let _ = slices.apply(line);
        assert!(pods.objects().len() <= bound && slices.objects().len() <= bound);
    }
});
