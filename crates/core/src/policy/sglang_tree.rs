//! The approximate radix tree of the `sglang_cache_aware` policy, over prompt bytes.
//!
//! Mirrors SGLang router's multi-tenant tree: each node holds an edge label and, per tenant
//! (instance), the last time a routed prompt passed through it. It is filled only from the
//! router's own decisions (no engine feedback), so it is approximate by construction.
//!
//! Invariants:
//! - `chars[t]` equals the total edge bytes of the nodes tenant `t` is present on.
//! - A tenant present on a node is present on all its ancestors (eviction removes leaves first).
//! - Bytes rather than characters: identical for ASCII, within a small factor for other UTF-8.

use crate::InstanceId;
use ahash::AHashMap;

const ROOT: u32 = 0;

#[derive(Debug, Default)]
struct Node {
    edge: Vec<u8>,
    parent: u32,
    /// Children keyed by the first byte of their edge.
    children: Vec<(u8, u32)>,
    /// (tenant, last access tick), in insertion order.
    tenants: Vec<(InstanceId, u64)>,
}

/// A multi-tenant approximate radix tree.
#[derive(Debug)]
pub struct Tree {
    nodes: Vec<Node>,
    free: Vec<u32>,
    chars: AHashMap<InstanceId, usize>,
}

impl Default for Tree {
    fn default() -> Self {
        Self {
            nodes: vec![Node::default()],
            free: Vec::new(),
            chars: AHashMap::new(),
        }
    }
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Tree {
    /// Registers a tenant with zero bytes (SGLang inserts each worker with an empty string).
    pub fn add_tenant(&mut self, t: InstanceId) {
        self.chars.entry(t).or_insert(0);
    }

    /// Bytes attributed to `t`, if it is a tenant.
    pub fn tenant_chars(&self, t: InstanceId) -> Option<usize> {
        self.chars.get(&t).copied()
    }

    /// Total bytes stored in edges.
    #[cfg(test)]
    pub fn total_bytes(&self) -> usize {
        self.nodes.iter().map(|n| n.edge.len()).sum()
    }

    fn child(&self, node: u32, byte: u8) -> Option<u32> {
        self.nodes[node as usize]
            .children
            .iter()
            .find(|(b, _)| *b == byte)
            .map(|(_, c)| *c)
    }

    fn alloc(&mut self, n: Node) -> u32 {
        if let Some(i) = self.free.pop() {
            self.nodes[i as usize] = n;
            i
        } else {
            self.nodes.push(n);
            (self.nodes.len() - 1) as u32
        }
    }

    fn touch(&mut self, node: u32, t: InstanceId, tick: u64) {
        let len = self.nodes[node as usize].edge.len();
        let n = &mut self.nodes[node as usize];
        match n.tenants.iter_mut().find(|(x, _)| *x == t) {
            Some(e) => e.1 = tick,
            None => {
                n.tenants.push((t, tick));
                *self.chars.entry(t).or_insert(0) += len;
            }
        }
    }

    /// Records that `text` was routed to `t` at `tick`.
    pub fn insert(&mut self, text: &[u8], t: InstanceId, tick: u64) {
        self.add_tenant(t);
        let mut node = ROOT;
        let mut rest = text;
        self.touch(node, t, tick);
        while let Some(&first) = rest.first() {
            match self.child(node, first) {
                None => {
                    let leaf = self.alloc(Node {
                        edge: rest.to_vec(),
                        parent: node,
                        ..Node::default()
                    });
                    self.nodes[node as usize].children.push((first, leaf));
                    self.touch(leaf, t, tick);
                    return;
                }
                Some(c) => {
                    let shared = common_prefix(&self.nodes[c as usize].edge, rest);
                    let c = if shared < self.nodes[c as usize].edge.len() {
                        self.split(c, shared)
                    } else {
                        c
                    };
                    self.touch(c, t, tick);
                    node = c;
                    rest = &rest[shared..];
                }
            }
        }
    }

    /// Splits `c`'s edge at `at`: a new parent keeps the first `at` bytes and `c`'s tenants.
    fn split(&mut self, c: u32, at: usize) -> u32 {
        let parent = self.nodes[c as usize].parent;
        let tail = self.nodes[c as usize].edge.split_off(at);
        let head = std::mem::replace(&mut self.nodes[c as usize].edge, tail);
        let tenants = self.nodes[c as usize].tenants.clone();
        let first = head[0];
        let tail_first = self.nodes[c as usize].edge[0];
        let mid = self.alloc(Node {
            edge: head,
            parent,
            children: vec![(tail_first, c)],
            tenants,
        });
        self.nodes[c as usize].parent = mid;
        if let Some(e) = self.nodes[parent as usize]
            .children
            .iter_mut()
            .find(|(b, _)| *b == first)
        {
            e.1 = mid;
        }
        mid
    }

    /// Longest match of `text`: (matched bytes, tenants of the deepest matched node in insertion
    /// order). A partial match inside an edge counts its matched bytes and that node's tenants.
    pub fn prefix_match(&self, text: &[u8]) -> (usize, &[(InstanceId, u64)]) {
        let mut node = ROOT;
        let mut matched = 0;
        let mut rest = text;
        while let Some(&first) = rest.first() {
            let Some(c) = self.child(node, first) else {
                break;
            };
            let shared = common_prefix(&self.nodes[c as usize].edge, rest);
            matched += shared;
            node = c;
            if shared < self.nodes[c as usize].edge.len() {
                break;
            }
            rest = &rest[shared..];
        }
        (matched, &self.nodes[node as usize].tenants)
    }

    /// Evicts least recently used leaves of every tenant above `max_bytes` until it fits.
    /// Cost O(tree); run periodically, not per request.
    pub fn evict_tenants_above(&mut self, max_bytes: usize) {
        let over: Vec<InstanceId> = self
            .chars
            .iter()
            .filter(|(_, &c)| c > max_bytes)
            .map(|(t, _)| *t)
            .collect();
        for t in over {
            self.evict_tenant(t, max_bytes);
        }
    }

    fn holds(&self, node: u32, t: InstanceId) -> Option<u64> {
        self.nodes[node as usize]
            .tenants
            .iter()
            .find(|(x, _)| *x == t)
            .map(|(_, k)| *k)
    }

    fn is_tenant_leaf(&self, node: u32, t: InstanceId) -> bool {
        self.nodes[node as usize]
            .children
            .iter()
            .all(|(_, c)| self.holds(*c, t).is_none())
    }

    fn evict_tenant(&mut self, t: InstanceId, max_bytes: usize) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let mut heap: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let i = i as u32;
            if i != ROOT
                && !n.edge.is_empty()
                && n.tenants.iter().any(|(x, _)| *x == t)
                && self.is_tenant_leaf(i, t)
            {
                if let Some(k) = self.holds(i, t) {
                    heap.push(Reverse((k, i)));
                }
            }
        }
        while self.chars.get(&t).copied().unwrap_or(0) > max_bytes {
            let Some(Reverse((_, node))) = heap.pop() else {
                break;
            };
            let parent = self.nodes[node as usize].parent;
            self.remove_tenant_from(node, t);
            if parent != ROOT && self.holds(parent, t).is_some() && self.is_tenant_leaf(parent, t) {
                if let Some(k) = self.holds(parent, t) {
                    heap.push(Reverse((k, parent)));
                }
            }
        }
    }

    fn remove_tenant_from(&mut self, node: u32, t: InstanceId) {
        let n = &mut self.nodes[node as usize];
        n.tenants.retain(|(x, _)| *x != t);
        let len = n.edge.len();
        if let Some(c) = self.chars.get_mut(&t) {
            *c = c.saturating_sub(len);
        }
        if self.nodes[node as usize].tenants.is_empty()
            && self.nodes[node as usize].children.is_empty()
        {
            let parent = self.nodes[node as usize].parent;
            self.nodes[parent as usize]
                .children
                .retain(|(_, c)| *c != node);
            self.nodes[node as usize] = Node::default();
            self.free.push(node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_match_split() {
        let mut t = Tree::default();
        t.insert(b"hello world", InstanceId(0), 1);
        t.insert(b"hello there", InstanceId(1), 2);
        let (m, ts) = t.prefix_match(b"hello world!");
        assert_eq!(m, 11);
        assert_eq!(ts.iter().map(|x| x.0 .0).collect::<Vec<_>>(), vec![0]);
        let (m, ts) = t.prefix_match(b"hello you");
        assert_eq!(m, 6);
        assert_eq!(ts.len(), 2);
        assert_eq!(t.tenant_chars(InstanceId(0)), Some(11));
        assert_eq!(t.tenant_chars(InstanceId(1)), Some(11));
        let (m, _) = t.prefix_match(b"xyz");
        assert_eq!(m, 0);
    }

    #[test]
    fn eviction_removes_lru_leaves_first() {
        let mut t = Tree::default();
        t.insert(b"aaaa-old", InstanceId(0), 1);
        t.insert(b"aaaa-new", InstanceId(0), 5);
        // "aaaa-" + "old" + "new" after the split.
        assert_eq!(t.tenant_chars(InstanceId(0)), Some(11));
        t.evict_tenants_above(9);
        assert_eq!(t.tenant_chars(InstanceId(0)), Some(8));
        assert_eq!(t.prefix_match(b"aaaa-new").0, 8);
        assert_eq!(t.prefix_match(b"aaaa-old").0, 5);
        t.evict_tenants_above(0);
        assert_eq!(t.tenant_chars(InstanceId(0)), Some(0));
        assert_eq!(t.prefix_match(b"aaaa-new").0, 0);
        assert_eq!(t.total_bytes(), 0);
    }
}
