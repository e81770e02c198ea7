//! Frames as the programs read and write them: XDP packet memory
//! ([`Packet`], [`XdpBytes`]) and socket buffers ([`Skb`]), behind
//! `pkeyfw_common`'s [`Frame`].

use aya_ebpf::{
    EbpfContext as _,
    bindings::{__sk_buff, BPF_F_MARK_MANGLED_0, xdp_md},
    helpers::{bpf_skb_load_bytes, bpf_xdp_get_buff_len, bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    programs::TcContext,
};
use pkeyfw_common::{
    Copied, Frame, InPlace, Stamp, Window,
    frame::MAX_OFFSET,
    stamp::{Plan, UDP_CHECK},
};

use crate::setup;

/// Packet memory between `data` and `data_end`: the linear part of the
/// frame, which holds the headers.
pub struct Packet {
    start: usize,
    end: usize,
    ctx: *mut xdp_md,
}

impl Packet {
    #[inline(always)]
    pub fn of(ctx: *mut xdp_md) -> Packet {
        // SAFETY: a live XDP context.
        let (start, end) = unsafe { ((*ctx).data as usize, (*ctx).data_end as usize) };
        Packet { start, end, ctx }
    }
}

impl Frame for Packet {
    #[inline(always)]
    fn header<T: Copy>(&self, off: usize) -> Option<T> {
        // The explicit bound on `off` is what the verifier needs to accept a
        // variable-offset packet pointer.
        if off > MAX_OFFSET {
            return None;
        }
        let at = self.start + bounded(off);
        if at + size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: within [data, data_end); header types are plain bytes.
        Some(unsafe { load_packet(at) })
    }

    type Bytes<const LEN: usize> = InPlace;

    #[inline(always)]
    fn window<const LEN: usize>(&self, off: usize) -> Option<Window<'_, InPlace, LEN>> {
        if off > MAX_OFFSET {
            return None;
        }
        let at = self.start + bounded(off);
        if at + LEN > self.end {
            return None;
        }
        // SAFETY: within [data, data_end), as the verifier sees.
        Some(unsafe { Window::new(InPlace(at)) })
    }

    /// The linear part and any fragments (a multi-buffer frame); where
    /// the program is loaded without fragments, the linear part is all.
    #[inline(always)]
    fn wire_len(&self) -> usize {
        if setup!(frags) == 0 {
            return self.end - self.start;
        }
        // SAFETY: a live XDP context.
        unsafe { bpf_xdp_get_buff_len(self.ctx) as usize }
    }
}

impl Packet {
    /// Writes `bytes` at `off` in the linear part.
    #[inline(always)]
    fn store<const N: usize>(&self, off: usize, bytes: [u8; N]) -> Result<(), Stamp> {
        if off > MAX_OFFSET {
            return Err(Stamp::HelperFailed);
        }
        let at = self.start + bounded(off);
        if at + N > self.end {
            return Err(Stamp::HelperFailed);
        }
        // SAFETY: within [data, data_end), checked above.
        unsafe { core::ptr::write_unaligned(at as *mut [u8; N], bytes) };
        Ok(())
    }
}

/// `off`, checked to be at most [`MAX_OFFSET`], masked in the register the
/// packet pointer is made from: a no-op for the values that pass, and a
/// bound the verifier sees there. Kernels before 5.11 carry a bound learnt
/// on one register to no copy of it (LLVM may compare one and add the
/// other), and refuse the access.
#[inline(always)]
fn bounded(off: usize) -> usize {
    const _: () = assert!(MAX_OFFSET < 8192);
    let mut off = off;
    // SAFETY: arithmetic on a register.
    unsafe {
        core::arch::asm!("{off} &= 8191", off = inout(reg) off, options(pure, nomem, nostack));
    }
    off
}

/// Copies a `T` out of packet memory at `at` in the widest loads that fit
/// (8, 4, 2, then 1 bytes). Header types are byte arrays, so a plain read
/// is compiled byte by byte, a load and a shift or two per byte: these
/// loads are written out because the verifier takes a misaligned packet
/// read where the CPU does it efficiently (x86-64, arm64), while LLVM's
/// misaligned-access mode would also misalign stack slots, which it
/// refuses. The copy lands in an 8-aligned buffer, so that the fields are
/// then read from it whole.
///
/// # Safety
/// `[at, at + size_of::<T>())` must be packet memory the verifier has seen
/// bounded, and `T` valid for any bytes.
#[inline(always)]
unsafe fn load_packet<T: Copy>(at: usize) -> T {
    #[repr(C, align(8))]
    struct Aligned<T>(core::mem::MaybeUninit<T>);
    let mut buf = Aligned(core::mem::MaybeUninit::<T>::uninit());
    let dst = buf.0.as_mut_ptr().cast::<u8>();
    let mut done = 0;
    macro_rules! chunk {
        ($ty:ty, $insn:literal) => {
            let v: $ty;
            // SAFETY: within the bounded range (the caller's promise); the
            // store is aligned: `done` is a multiple of the chunk's size.
            unsafe {
                core::arch::asm!(
                    $insn,
                    v = out(reg) v,
                    p = in(reg) at + done,
                    options(pure, readonly, nostack),
                );
                dst.add(done).cast::<$ty>().write(v);
            }
            done += size_of::<$ty>();
        };
    }
    while done + 8 <= size_of::<T>() {
        chunk!(u64, "{v} = *(u64 *)({p} + 0)");
    }
    if done + 4 <= size_of::<T>() {
        chunk!(u32, "{v} = *(u32 *)({p} + 0)");
    }
    if done + 2 <= size_of::<T>() {
        chunk!(u16, "{v} = *(u16 *)({p} + 0)");
    }
    if done < size_of::<T>() {
        chunk!(u8, "{v} = *(u8 *)({p} + 0)");
    }
    let _ = done;
    // SAFETY: every byte written above; T is valid for any bytes.
    unsafe { buf.0.assume_init() }
}

/// Rewrites XDP packet bytes: through the helpers (Linux 5.18+), which
/// reach a multi-buffer frame's fragments, or, loaded without fragments,
/// in the linear part the frame is then all of.
pub struct XdpBytes(pub *mut xdp_md);

impl XdpBytes {
    #[inline(always)]
    fn load<const N: usize>(&self, off: usize) -> Result<[u8; N], Stamp> {
        if setup!(frags) == 0 {
            return Packet::of(self.0).header(off).ok_or(Stamp::HelperFailed);
        }
        let mut bytes = [0u8; N];
        // SAFETY: a live XDP context and a buffer of N bytes.
        let rc =
            unsafe { bpf_xdp_load_bytes(self.0, off as u32, bytes.as_mut_ptr().cast(), N as u32) };
        if rc == 0 {
            Ok(bytes)
        } else {
            Err(Stamp::HelperFailed)
        }
    }

    #[inline(always)]
    fn store<const N: usize>(&self, off: usize, mut bytes: [u8; N]) -> Result<(), Stamp> {
        if setup!(frags) == 0 {
            return Packet::of(self.0).store(off, bytes);
        }
        // SAFETY: a live XDP context and a buffer of N bytes.
        let rc =
            unsafe { bpf_xdp_store_bytes(self.0, off as u32, bytes.as_mut_ptr().cast(), N as u32) };
        if rc == 0 {
            Ok(())
        } else {
            Err(Stamp::HelperFailed)
        }
    }

    /// Applies `plan`: P_Key, ICRC, UDP checksum.
    #[inline(always)]
    pub fn rewrite(&self, plan: &Plan) -> Result<(), Stamp> {
        let check_at = plan.udp_at + UDP_CHECK;
        let patch = plan
            .patch(self.load(plan.icrc_at)?, self.load(check_at)?)
            .ok_or(Stamp::TooLong)?;
        self.store(plan.pkey_at, patch.pkey)?;
        self.store(plan.icrc_at, patch.icrc)?;
        self.store(check_at, patch.check)
    }
}

/// A socket buffer, read and written through the skb helpers, which also
/// reach the paged part of a non-linear skb.
pub struct Skb(pub TcContext);

impl Frame for Skb {
    /// Copied out through the helper, which also reaches the skb's pages.
    type Bytes<const LEN: usize> = Copied<LEN>;

    #[inline(always)]
    fn header<T: Copy>(&self, off: usize) -> Option<T> {
        if off > MAX_OFFSET {
            return None;
        }
        self.0.load::<T>(off).ok()
    }

    /// Into a buffer set before the helper writes it: a failed copy must
    /// leave no byte undefined on any path (the verifier refuses a value
    /// the compiler kept from an uninitialised buffer, even unused).
    #[inline(always)]
    fn window<const LEN: usize>(&self, off: usize) -> Option<Window<'_, Copied<LEN>, LEN>> {
        if off > MAX_OFFSET {
            return None;
        }
        let mut bytes = Copied([0; LEN]);
        // SAFETY: a live skb and a buffer of LEN bytes.
        let copied = unsafe {
            bpf_skb_load_bytes(
                self.0.as_ptr(),
                off as u32,
                bytes.0.as_mut_ptr().cast(),
                LEN as u32,
            )
        } == 0;
        copied.then(|| Window::copied(bytes))
    }

    #[inline(always)]
    fn wire_len(&self) -> usize {
        self.0.len() as usize
    }

    #[inline(always)]
    fn gso_size(&self) -> u32 {
        // SAFETY: a live __sk_buff; gso_size is readable by TC programs.
        unsafe { (*self.0.as_ptr().cast::<__sk_buff>()).gso_size }
    }

    #[inline(always)]
    fn stripped_vlan_tags(&self) -> usize {
        // SAFETY: a live __sk_buff; vlan_present is readable by TC programs.
        unsafe { (*self.0.as_ptr().cast::<__sk_buff>()).vlan_present as usize }
    }

    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        // SAFETY: a live __sk_buff; ingress_ifindex is readable by TC programs.
        unsafe { (*self.0.as_ptr().cast::<__sk_buff>()).ingress_ifindex }
    }
}

impl Skb {
    /// Applies `plan`: P_Key and ICRC stored, the UDP checksum updated by the
    /// kernel, which leaves a CHECKSUM_PARTIAL one (still to be computed) and
    /// a zero one (none) alone.
    #[inline(always)]
    pub fn rewrite(&self, plan: &Plan) -> Result<(), Stamp> {
        let ctx = &self.0;
        let icrc = ctx
            .load::<[u8; 4]>(plan.icrc_at)
            .map_err(|_| Stamp::HelperFailed)?;
        let check = ctx
            .load::<[u8; 2]>(plan.udp_at + UDP_CHECK)
            .map_err(|_| Stamp::HelperFailed)?;
        let patch = plan.patch(icrc, check).ok_or(Stamp::TooLong)?;
        // Size 0: `to` is a difference of sums, in the kernel's (memory-order)
        // view of the checksum words.
        let diff = u16::from_ne_bytes(patch.check_diff.to_be_bytes());
        ctx.store(plan.pkey_at, &patch.pkey, 0)
            .and_then(|()| ctx.store(plan.icrc_at, &patch.icrc, 0))
            .and_then(|()| {
                ctx.l4_csum_replace(
                    plan.udp_at + UDP_CHECK,
                    0,
                    u64::from(diff),
                    BPF_F_MARK_MANGLED_0 as u64,
                )
            })
            .map_err(|_| Stamp::HelperFailed)
    }
}
