//! The global allocator of kvgate's binaries: mimalloc, called the way its fast paths expect.
//!
//! Why not `mimalloc::MiMalloc`: that wrapper sends every request through `mi_malloc_aligned`,
//! and mimalloc v3 serves an aligned request for more than 1 KiB, or for a size whose size class
//! is not a power of two, by over-allocating and adjusting the pointer: a slower path and a larger
//! block. Nearly every Rust allocation asks for an alignment that plain `mi_malloc` already
//! guarantees, so those go to the plain calls.
//!
//! Invariant: a block is allocated, reallocated and freed through the same family of calls
//! (plain or aligned), decided by its layout's alignment and size alone; `mi_free` frees both.

use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// The alignment every `mi_malloc` block of at least this many bytes has (`MI_MAX_ALIGN_SIZE`);
/// smaller blocks are aligned to their size class, a multiple of 8.
const PLAIN_ALIGN: usize = 16;

/// Whether plain `mi_malloc(size)` already satisfies `align` (the rule std's system allocator
/// uses for `malloc`).
#[inline]
fn plain(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

/// mimalloc as the global allocator.
pub struct MiMalloc;

// SAFETY: every method forwards to the mimalloc call with the same contract, choosing the plain
// call only when its guaranteed alignment covers the layout's.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain(layout.align(), layout.size()) {
            mi::mi_malloc(layout.size()) as *mut u8
        } else {
            mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain(layout.align(), layout.size()) {
            mi::mi_zalloc(layout.size()) as *mut u8
        } else {
            mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi::mi_free(ptr as *mut c_void);
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if plain(layout.align(), new_size) {
            mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size and alignment a Rust program asks for comes back aligned, writable, and keeps
    /// its bytes across growth and shrinking.
    #[test]
    fn allocations_are_aligned_and_keep_their_bytes() {
        let a = MiMalloc;
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in [1usize, 3, 8, 15, 16, 24, 48, 100, 1000, 1500, 4097, 70_000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    std::ptr::write_bytes(p, 0xAB, size);
                    let grown = a.realloc(p, layout, size * 3);
                    assert_eq!(grown as usize % align, 0, "grow {size} align {align}");
                    assert!((0..size).all(|i| *grown.add(i) == 0xAB));
                    let grown_layout = Layout::from_size_align(size * 3, align).unwrap();
                    let shrunk = a.realloc(grown, grown_layout, size / 2 + 1);
                    assert_eq!(shrunk as usize % align, 0, "shrink {size} align {align}");
                    assert!((0..size / 2 + 1).all(|i| *shrunk.add(i) == 0xAB));
                    a.dealloc(
                        shrunk,
                        Layout::from_size_align(size / 2 + 1, align).unwrap(),
                    );
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0);
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
