//! P_Key stamping. rdma_rxe sends and accepts only P_Key 0xFFFF; InfiniBand
//! puts the sending QP's own P_Key in every BTH. The TC egress program writes
//! the sending QP's bound P_Key into outgoing RoCE v2 frames ([`egress`]), the
//! XDP program writes 0xFFFF back into incoming frames it passes
//! ([`ingress`]), so the verdict judges the stamped value and the local rxe
//! still sees what it accepts. Both patch the ICRC and UDP checksum in O(1)
//! ([`Plan::patch`]); the programs only read and write the bytes.

use network_types::udp::UdpHdr;

use crate::{
    Outcome, Tables,
    abi::{Config, cm::cm_state::RECORDS_CONNECTIONS, counters::Stamp},
    cm, csum,
    frame::Frame,
    icrc,
    parse::{self, Bth, Class, Parsed, Roce},
    pkey,
    verdict::{GSI_QPN, SMI_QPN},
};

/// What the egress program does with an outgoing frame, and what it counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Writes the plan; counted as the outcome (`Stamped`, `Defaulted`)
    /// once done.
    Rewrite(Plan, Stamp),
    /// Sends the frame as it is.
    Leave(Stamp),
    /// Refuses the frame: it would leave with a P_Key the port may not send.
    Drop(Stamp),
}

/// Who sends an outgoing frame, as rdma_rxe's own state says.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// QP `qpn` of an rdma_rxe device on this interface: the frame's socket
    /// is the one rxe made for that QP (rxe keeps the QP in the socket's
    /// user data, and the QP's socket is this one).
    Qp(u32),
    /// Anything else: a process's UDP socket (open or closed), a forwarded
    /// frame, a packet or tap socket. What it names (a DETH source QP, a
    /// connected peer) claims nothing.
    Other,
}

/// A P_Key rewrite, located: where the bytes are and what they become.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Plan {
    /// Offset of the BTH P_Key.
    pub pkey_at: usize,
    pub old: u16,
    pub new: u16,
    /// Offset of the UDP header (its checksum is 6 bytes in).
    pub udp_at: usize,
    /// Offset of the ICRC, the UDP payload's last four bytes.
    pub icrc_at: usize,
    /// Break the ICRC (every bit flipped) after keeping it true to the new
    /// P_Key: a switch port's `corrupt` (see [`corruption`]).
    pub corrupt: bool,
}

/// The bytes a [`Plan`] writes, given the ICRC and checksum it read.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    pub pkey: [u8; 2],
    pub icrc: [u8; 4],
    pub check: [u8; 2],
    /// The change of the UDP data's sum, for helpers that update the checksum
    /// themselves (`bpf_l4_csum_replace`).
    pub check_diff: u16,
}

/// Offset of the checksum in the UDP header.
pub const UDP_CHECK: usize = 6;

impl Plan {
    /// Covered bytes between the P_Key and the ICRC.
    #[inline(always)]
    const fn bytes_after(&self) -> usize {
        self.icrc_at - (self.pkey_at + 2)
    }

    /// The new P_Key, ICRC and UDP checksum for a frame whose ICRC and
    /// checksum were `icrc` and `check` (as stored); `None` if the ICRC is too
    /// far to patch.
    #[inline(always)]
    pub fn patch(&self, icrc: [u8; 4], check: [u8; 2]) -> Option<Patch> {
        let patched = icrc::patch_u16(
            u32::from_le_bytes(icrc),
            self.old,
            self.new,
            self.bytes_after(),
        )?;
        let new_icrc = if self.corrupt { !patched } else { patched }.to_le_bytes();
        // The P_Key sits at an even offset of the UDP data (8 + 2); the
        // ICRC's parity is the UDP length's.
        let check_diff = csum::add(
            csum::diff(self.old, self.new, false),
            csum::diff(
                csum::sum(&icrc),
                csum::sum(&new_icrc),
                (self.icrc_at - self.udp_at) % 2 == 1,
            ),
        );
        Some(Patch {
            pkey: self.new.to_be_bytes(),
            icrc: new_icrc,
            check: csum::udp_update(u16::from_be_bytes(check), check_diff).to_be_bytes(),
            check_diff,
        })
    }
}

/// Whether the policy stamps (and restores): egress reads no frame while
/// it does not (the kernel does not even locate its headers).
#[inline(always)]
pub fn stamping(config: &Config) -> bool {
    config.stamp != 0
}

/// What egress does with an outgoing frame, or `None` when the policy does
/// not stamp (nothing is counted then). An HCA sends only keys of its port's
/// table, each QP its own: a bound QP's frame gets its QP's P_Key, to QP1
/// too; QP0's and QP1's own keep a key of the port's table, a CM MAD its
/// connection's; a management frame (QP0/QP1 as source or destination)
/// from anything but a QP is dropped; anything else leaves with the port's
/// default P_Key, whatever key its sender wrote. What cannot be judged as
/// one packet is dropped, and so is a rewrite that cannot be done, rather
/// than let the key it carries out.
#[inline(always)]
pub fn egress<F: Frame + ?Sized, T: Tables>(
    frame: &F,
    tables: &T,
    config: &Config,
    origin: impl FnOnce() -> Origin,
) -> Option<Action> {
    egress_parsed(frame, || parse::classify(frame), tables, config, origin)
}

/// [`egress`], classifying the frame with `parse` (only while the policy
/// stamps).
#[inline(always)]
pub fn egress_parsed<F: Frame + ?Sized, T: Tables>(
    frame: &F,
    parse: impl FnOnce() -> Parsed,
    tables: &T,
    config: &Config,
    origin: impl FnOnce() -> Origin,
) -> Option<Action> {
    if !stamping(config) {
        return None;
    }
    let roce = match parse() {
        // rdma_rxe sends one well-formed packet per skb: anything else
        // could carry packets past what is judged here, and any process
        // may send it (UDP_SEGMENT, a datagram the stack fragments).
        Parsed {
            class: Class::Roce,
            roce,
        } if roce.aggregate(frame) => return Some(Action::Drop(Stamp::Gso)),
        Parsed {
            class: Class::Malformed,
            ..
        } => return Some(Action::Drop(Stamp::Malformed)),
        // RoCE v1 has no UDP header to attribute or patch; sending it takes
        // a raw socket, which takes privilege.
        Parsed {
            class: Class::Roce,
            roce,
        } if roce.udp_at().is_some() => roce,
        _ => return Some(Action::Leave(Stamp::NotRoce)),
    };
    let ud = roce.ud();
    let management =
        matches!(roce.dest_qp(), SMI_QPN | GSI_QPN) || (ud && roce.src_qp() <= GSI_QPN);
    // Asked only of a RoCE v2 frame while the policy stamps.
    let sender = match origin() {
        Origin::Qp(qpn) => Some(qpn),
        Origin::Other => None,
    };
    Some(match sender {
        // A process's frame naming QP0/QP1 could otherwise carry any key
        // of the table to any QP.
        None if management => Action::Drop(Stamp::Forged),
        // QP0's and QP1's own: rdma_rxe writes a datagram's DETH with the
        // number of the QP that sends it.
        Some(_) if ud && roce.src_qp() <= GSI_QPN => management_frame(frame, &roce, tables, config),
        // Any other QP's frame has its QP's key, to QP1 too (a CM request a
        // tenant makes itself, from a UD QP: its own partition's, which the
        // far end's listener judges).
        _ => match key_of(tables, config, sender) {
            Ok((key, true)) => with_key(frame, &roce, key, Stamp::Unchanged, Stamp::Stamped),
            Ok((key, false)) => with_key(frame, &roce, key, Stamp::Unbound, Stamp::Defaulted),
            Err(why) => Action::Drop(why),
        },
    })
}

/// A frame QP0 or QP1 sends. QP1's CM MADs leave with their connection's
/// P_Key ([`crate::cm`]) where the probes record connections — the one it
/// was set up with, to its last DREQ, REJ or DREP, sent when its QP may be
/// gone — or the default one; any other keeps a key of the port's table,
/// or gets the default one: never dropped, which would only have rdma_rxe
/// send it again and again.
#[inline(always)]
fn management_frame<F: Frame + ?Sized, T: Tables>(
    frame: &F,
    roce: &Roce,
    tables: &T,
    config: &Config,
) -> Action {
    if roce.src_qp() == GSI_QPN
        && tables.cm_records() & RECORDS_CONNECTIONS != 0
        && let Some(mad) = cm::mad(frame, roce)
    {
        return match mad.sender(frame).and_then(|key| tables.connection(key)) {
            Some(key) => with_key(frame, roce, key, Stamp::Cm, Stamp::Cm),
            None => with_key(
                frame,
                roce,
                config.default_pkey,
                Stamp::CmDefaulted,
                Stamp::CmDefaulted,
            ),
        };
    }
    if pkey::port::holds(roce.pkey(), tables.port_flags(pkey::key(roce.pkey()))) {
        Action::Leave(Stamp::Management)
    } else {
        with_key(
            frame,
            roce,
            config.default_pkey,
            Stamp::Management,
            Stamp::Defaulted,
        )
    }
}

/// The P_Key the frames of QP `qpn` (None: of no QP) leave with, and
/// whether a binding gave it: the QP's binding's, else the port's default;
/// none for a QP in quarantine, which a rule would bind (dropped: it never
/// leaves with the default key).
#[inline(always)]
fn key_of<T: Tables>(tables: &T, config: &Config, qpn: Option<u32>) -> Result<(u16, bool), Stamp> {
    match qpn.map(|q| (q, tables.qp(q))) {
        Some((_, Some(qp))) => Ok((qp.pkey, true)),
        Some((q, None)) if tables.quarantined(q) => Err(Stamp::Quarantined),
        _ => Ok((config.default_pkey, false)),
    }
}

/// A frame to leave with P_Key `key`: as it is where it has it (counted
/// `kept`), else rewritten (counted `done`).
#[inline(always)]
fn with_key<F: Frame + ?Sized>(
    frame: &F,
    roce: &Roce,
    key: u16,
    kept: Stamp,
    done: Stamp,
) -> Action {
    if roce.pkey() == key {
        return Action::Leave(kept);
    }
    match plan(frame, roce, key) {
        Ok(plan) => Action::Rewrite(plan, done),
        Err(why) => Action::Drop(why),
    }
}

/// The restore for an incoming frame the verdict passed: `None` when nothing
/// is to be done (stamping off, dropped, not RoCE v2, already 0xFFFF).
#[inline(always)]
pub fn ingress<F: Frame + ?Sized>(
    frame: &F,
    outcome: &Outcome,
    config: &Config,
) -> Option<Result<Plan, Stamp>> {
    if !restores(outcome, config) {
        return None;
    }
    Some(plan(frame, &outcome.roce?, pkey::DEFAULT))
}

/// Whether an incoming frame is to have its P_Key restored (see
/// [`ingress`]).
#[inline(always)]
pub fn restores(outcome: &Outcome, config: &Config) -> bool {
    stamping(config)
        && outcome.pass
        && outcome
            .roce
            .is_some_and(|roce| roce.udp_at().is_some() && roce.pkey() != pkey::DEFAULT)
}

/// Locates the rewrite of a RoCE v2 frame's P_Key to `new`.
#[inline(always)]
pub fn plan<F: Frame + ?Sized>(frame: &F, roce: &parse::Roce, new: u16) -> Result<Plan, Stamp> {
    let plan = locate(frame, roce, new)?;
    if plan.bytes_after() >= icrc::MAX_PATCH_DISTANCE {
        return Err(Stamp::TooLong);
    }
    Ok(plan)
}

/// Locates the corruption of a RoCE v2 frame, its UDP checksum kept true so
/// that the frame reaches the receiving HCA and fails there: the P_Key
/// becomes the invalid 0, and the ICRC is broken.
#[inline(always)]
pub fn corruption<F: Frame + ?Sized>(frame: &F, roce: &parse::Roce) -> Result<Plan, Stamp> {
    Ok(Plan {
        corrupt: true,
        ..plan(frame, roce, pkey::INVALID)?
    })
}

/// Where a RoCE v2 frame's P_Key, UDP header and ICRC are.
#[inline(always)]
fn locate<F: Frame + ?Sized>(frame: &F, roce: &parse::Roce, new: u16) -> Result<Plan, Stamp> {
    let udp_at = roce.udp_at().ok_or(Stamp::NotRoce)?;
    let udp = frame.header::<UdpHdr>(udp_at).ok_or(Stamp::NotRoce)?;
    let icrc_at = (udp_at + u16::from_be_bytes(udp.len) as usize)
        .checked_sub(4)
        .ok_or(Stamp::NotRoce)?;
    if icrc_at < roce.bth_at() + Bth::LEN {
        return Err(Stamp::NotRoce);
    }
    let plan = Plan {
        pkey_at: roce.bth_at() + 2,
        old: roce.pkey(),
        new,
        udp_at,
        icrc_at,
        corrupt: false,
    };
    // A UDP length that runs past the frame: there is no ICRC to patch.
    if icrc_at + 4 > frame.wire_len() {
        return Err(Stamp::NotRoce);
    }
    Ok(plan)
}
