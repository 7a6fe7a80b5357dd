//! Peak heap of one command, for tools/bench-million.sh: a counting global
//! allocator (two relaxed atomic adds per allocation) whose peak live bytes
//! are printed on stderr at exit when `DELTAMEM_PEAK_HEAP` is set. Mapped
//! bank files are not heap and do not count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator, which
// upholds the GlobalAlloc contract; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is passed on unchanged.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: ptr came from `alloc` with this layout (caller contract).
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Prints the peak when asked to by the environment.
pub fn report() {
    if std::env::var_os("DELTAMEM_PEAK_HEAP").is_some() {
        eprintln!("deltamem: peak heap {} bytes", PEAK_BYTES.load(Ordering::Relaxed));
    }
}
