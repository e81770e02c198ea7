//! Read access to a frame's bytes, implemented over packet memory by the XDP
//! program and over byte slices on the host.

use core::mem::size_of;

/// Offsets past this are refused: no XDP buffer is longer, and a bounded
/// offset is what lets the verifier accept variable-offset packet reads.
pub const MAX_OFFSET: usize = 4096;

/// A frame whose headers can be read at byte offsets.
pub trait Frame {
    /// The `T` stored at `off`, or `None` when the frame ends before it does.
    /// `T` must be a plain header type, valid for any bytes.
    fn header<T: Copy>(&self, off: usize) -> Option<T>;

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

    #[inline]
    fn wire_len(&self) -> usize {
        self.len()
    }
}
