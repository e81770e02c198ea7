//! Read access to a frame's bytes, implemented over packet memory by the XDP
//! program and over byte slices on the host.

use core::{marker::PhantomData, mem::size_of};

/// Offsets past this are refused: no XDP buffer is longer, and a bounded
/// offset is what lets the verifier accept variable-offset packet reads.
pub const MAX_OFFSET: usize = 4096;

/// A frame whose headers can be read at byte offsets.
pub trait Frame {
    /// The `T` stored at `off`, or `None` when the frame ends before it does.
    /// `T` must be a plain header type, valid for any bytes.
    fn header<T: Copy>(&self, off: usize) -> Option<T>;

    /// How a [`Window`] of this frame holds its bytes: their address
    /// ([`InPlace`]) or a copy ([`Copied`]).
    type Bytes<const LEN: usize>: Read;

    /// The `LEN` bytes at `off`, checked once to be there (`None` when the
    /// frame ends before they do): what the parse reads a header's fields
    /// from, each at an offset the compiler knows, with no check of its
    /// own.
    fn window<const LEN: usize>(&self, off: usize) -> Option<Window<'_, Self::Bytes<LEN>, LEN>>;

    /// The frame's length in bytes, all of it (not only what `header`
    /// can reach).
    fn wire_len(&self) -> usize;

    /// The segment size of a GSO/GRO packet (`skb->gso_size`), 0 for one
    /// packet. Only the TC program sees super-packets; XDP and host frames
    /// are single packets.
    #[inline(always)]
    fn gso_size(&self) -> u32 {
        0
    }

    /// VLAN tags the kernel already took off the frame into metadata (the
    /// TC program's skb: at most one), which count against
    /// [`MAX_VLAN_TAGS`](crate::parse::MAX_VLAN_TAGS) as XDP would count
    /// them in the frame.
    #[inline(always)]
    fn stripped_vlan_tags(&self) -> usize {
        0
    }

    /// The interface the frame entered this host through (`skb_iif`), for
    /// a frame a switch port forwards out (TC egress); 0 for one the host
    /// made itself, and wherever it is not known (XDP, host frames).
    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        0
    }
}

impl Frame for [u8] {
    #[inline]
    fn header<T: Copy>(&self, off: usize) -> Option<T> {
        if off > MAX_OFFSET || off + size_of::<T>() > self.len() {
            return None;
        }
        // SAFETY: in bounds (checked above); callers only ask for plain header
        // types, valid for any bit pattern; the read is unaligned.
        Some(unsafe { core::ptr::read_unaligned(self.as_ptr().add(off).cast::<T>()) })
    }

    type Bytes<const LEN: usize> = InPlace;

    #[inline]
    fn window<const LEN: usize>(&self, off: usize) -> Option<Window<'_, InPlace, LEN>> {
        if off > MAX_OFFSET || off + LEN > self.len() {
            return None;
        }
        // SAFETY: in bounds (checked above), borrowed as long as the window.
        Some(unsafe { Window::new(InPlace(self.as_ptr().add(off) as usize)) })
    }

    #[inline]
    fn wire_len(&self) -> usize {
        self.len()
    }
}

/// `LEN` bytes of a frame, checked once to be there ([`Frame::window`]):
/// the numbers in them are read with no check each, at offsets the
/// compiler knows (so that the kernel's verifier sees constant offsets
/// into a range it has seen bounded).
pub struct Window<'a, B, const LEN: usize> {
    bytes: B,
    frame: PhantomData<&'a ()>,
}

impl<'a, B: Read, const LEN: usize> Window<'a, B, LEN> {
    /// A window on `bytes`.
    ///
    /// # Safety
    /// `bytes` must hold `LEN` bytes, or address `LEN` bytes readable for
    /// `'a` (in a BPF program: packet memory the verifier has seen
    /// bounded).
    #[inline(always)]
    pub unsafe fn new(bytes: B) -> Window<'a, B, LEN> {
        Window {
            bytes,
            frame: PhantomData,
        }
    }

    /// The big-endian number of `N` bytes (1, 2, 4 or 8) at `OFF`.
    #[inline(always)]
    pub fn be<const OFF: usize, const N: usize>(&self) -> u64 {
        const { assert!(OFF + N <= LEN && matches!(N, 1 | 2 | 4 | 8)) };
        // SAFETY: within the LEN bytes (the constructor's promise).
        unsafe { self.bytes.be::<OFF, N>() }
    }
}

impl<const LEN: usize> Window<'_, Copied<LEN>, LEN> {
    /// A window on bytes copied out of a frame.
    #[inline(always)]
    pub fn copied(bytes: Copied<LEN>) -> Self {
        // SAFETY: the copy holds LEN bytes.
        unsafe { Window::new(bytes) }
    }
}

/// Where a [`Window`]'s bytes are read from.
pub trait Read {
    /// The big-endian number of `N` bytes at `OFF`.
    ///
    /// # Safety
    /// `[OFF, OFF + N)` must be within the window.
    unsafe fn be<const OFF: usize, const N: usize>(&self) -> u64;
}

/// A window's bytes in memory, at this address (packet memory, a slice's
/// bytes).
#[derive(Copy, Clone)]
pub struct InPlace(pub usize);

impl Read for InPlace {
    #[inline(always)]
    unsafe fn be<const OFF: usize, const N: usize>(&self) -> u64 {
        // SAFETY: readable (the window's promise).
        unsafe { load_be::<OFF, N>(self.0) }
    }
}

/// A window's bytes copied out of a frame, 8-aligned, so that a number at
/// an offset its size divides is read in one load.
#[repr(C, align(8))]
pub struct Copied<const LEN: usize>(pub [u8; LEN]);

impl<const LEN: usize> Read for Copied<LEN> {
    #[inline(always)]
    unsafe fn be<const OFF: usize, const N: usize>(&self) -> u64 {
        let mut word = [0; 8];
        word[8 - N..].copy_from_slice(&self.0[OFF..OFF + N]);
        u64::from_be_bytes(word)
    }
}

/// The big-endian number of `N` bytes at `at + OFF`, in one load: the BPF
/// instruction set's (which the verifier takes misaligned where the CPU
/// does it efficiently, x86-64 and arm64: LLVM would read byte by byte),
/// with `OFF` in the instruction (no add of its own).
///
/// # Safety
/// `[at + OFF, at + OFF + N)` must be readable.
#[cfg(target_arch = "bpf")]
#[inline(always)]
unsafe fn load_be<const OFF: usize, const N: usize>(at: usize) -> u64 {
    const { assert!(OFF <= i16::MAX as usize) };
    let v: u64;
    // SAFETY: readable (the caller's promise).
    unsafe {
        match N {
            1 => {
                core::arch::asm!("{v} = *(u8 *)({p} + {off})", v = out(reg) v, p = in(reg) at, off = const OFF, options(pure, readonly, nostack))
            }
            2 => {
                core::arch::asm!("{v} = *(u16 *)({p} + {off})", v = out(reg) v, p = in(reg) at, off = const OFF, options(pure, readonly, nostack))
            }
            4 => {
                core::arch::asm!("{v} = *(u32 *)({p} + {off})", v = out(reg) v, p = in(reg) at, off = const OFF, options(pure, readonly, nostack))
            }
            _ => {
                core::arch::asm!("{v} = *(u64 *)({p} + {off})", v = out(reg) v, p = in(reg) at, off = const OFF, options(pure, readonly, nostack))
            }
        }
    }
    // The bytes sit in the low N bytes, in memory order (little-endian).
    v.swap_bytes() >> (64 - 8 * N)
}

#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
unsafe fn load_be<const OFF: usize, const N: usize>(at: usize) -> u64 {
    // SAFETY: readable (the caller's promise).
    let bytes = unsafe { core::ptr::read_unaligned((at + OFF) as *const [u8; N]) };
    let mut word = [0; 8];
    word[8 - N..].copy_from_slice(&bytes);
    u64::from_be_bytes(word)
}
