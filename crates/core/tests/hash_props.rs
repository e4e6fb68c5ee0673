//! Property tests of the block hash chains.

use kvgate_core::hash::{
    hash_text_blocks, hash_token_blocks, namespace_root, text_chain, token_chain, Namespace,
};
use proptest::prelude::*;

fn ns<'a>(model: &'a str, lora: &'a Option<String>, salt: &'a Option<String>) -> Namespace<'a> {
    Namespace {
        model,
        lora: lora.as_deref(),
        cache_salt: salt.as_deref(),
    }
}

proptest! {
    #[test]
    fn token_prefix_hashes_are_a_prefix(tokens in prop::collection::vec(any::<u32>(), 0..300), cut in 0usize..300, bs in 1usize..40) {
        let n = Namespace { model: "m", lora: None, cache_salt: None };
        let full = token_chain(&n, &tokens, bs);
        let cut = cut.min(tokens.len());
        let part = token_chain(&n, &tokens[..cut], bs);
        prop_assert_eq!(full.len(), tokens.len() / bs);
        prop_assert_eq!(&full[..part.len()], &part[..]);
    }

    #[test]
    fn text_prefix_hashes_are_a_prefix(text in prop::collection::vec(any::<u8>(), 0..600), cut in 0usize..600, bs in 1usize..70) {
        let n = Namespace { model: "m", lora: Some("l"), cache_salt: None };
        let full = text_chain(&n, &text, bs);
        let cut = cut.min(text.len());
        let part = text_chain(&n, &text[..cut], bs);
        prop_assert_eq!(full.len(), text.len() / bs);
        prop_assert_eq!(&full[..part.len()], &part[..]);
    }

    #[test]
    fn chains_continue_from_a_parent(tokens in prop::collection::vec(any::<u32>(), 0..200), k in 0usize..10, bs in 1usize..16) {
        let n = Namespace::default();
        let full = token_chain(&n, &tokens, bs);
        let k = k.min(full.len());
        let mut out = full[..k].to_vec();
        let parent = if k == 0 { namespace_root(&n) } else { full[k - 1] };
        hash_token_blocks(parent, &tokens[k * bs..], bs, &mut out);
        prop_assert_eq!(out, full.clone());
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let mut text = Vec::new();
        hash_text_blocks(namespace_root(&n), &bytes, 4 * bs, &mut text);
        // Token mode is text mode over the LE encoding: one wire format, two inputs.
        prop_assert_eq!(text, full);
    }

    #[test]
    fn namespaces_are_isolated(
        a in ("[a-c]{0,3}", proptest::option::of("[a-c]{0,2}"), proptest::option::of("[a-c]{0,2}")),
        b in ("[a-c]{0,3}", proptest::option::of("[a-c]{0,2}"), proptest::option::of("[a-c]{0,2}")),
        tokens in prop::collection::vec(any::<u32>(), 16..64),
    ) {
        let (na, nb) = (ns(&a.0, &a.1, &a.2), ns(&b.0, &b.1, &b.2));
        let (ca, cb) = (token_chain(&na, &tokens, 16), token_chain(&nb, &tokens, 16));
        if na == nb {
            prop_assert_eq!(ca, cb);
        } else {
            prop_assert_ne!(namespace_root(&na), namespace_root(&nb));
            prop_assert!(ca.iter().zip(&cb).all(|(x, y)| x != y));
        }
    }
}
