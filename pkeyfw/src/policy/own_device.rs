//! `own_device`: a soft-RoCE device pkeyfw makes for the tenant of one
//! `[[bind]]` rule, on a network device of its own (a macvlan of the
//! policy's interface) with addresses of its own. rdma_rxe hands frames
//! between QPs of one device over inside the driver, where no program sees
//! them; between two devices they cross the network stack, where the
//! tenants' ports judge and stamp them. A policy gives every rule a device
//! or none: a rule without one would share the interface's device with the
//! others, which is what the devices are for.

use std::net::IpAddr;

use serde::Deserialize;
use toml::Spanned;

use super::{PolicyError, ctx::Ctx};

/// Longest network device name Linux takes (`IFNAMSIZ` - 1); the RDMA
/// device's name defaults to it as the interface's.
const MAX_IFNAME: usize = 15;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOwnDevice {
    name: Option<Spanned<String>>,
    interface: Option<Spanned<String>>,
    address: Option<Spanned<toml::Value>>,
    gateway: Option<Spanned<String>>,
}

/// A tenant's own device, as the policy gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnDevice {
    /// The soft-RoCE device (`rdma link`).
    pub name: String,
    /// Its network device: a macvlan of the policy's interface.
    pub iface: String,
    /// Its addresses, each with its prefix: its RoCE v2 GIDs, and the
    /// tenant's routes.
    pub addrs: Vec<Prefix>,
    /// Where its traffic beyond its prefixes goes, per family.
    pub gateways: Vec<IpAddr>,
}

/// An address and its prefix length.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl Prefix {
    /// Whether `addr` is in this prefix.
    pub fn contains(&self, addr: IpAddr) -> bool {
        self.network()
            == Prefix {
                addr,
                len: self.len,
            }
            .network()
    }

    /// The network: the address with its host bits cleared.
    pub fn network(&self) -> IpAddr {
        let host = |bits: u32| bits - u32::from(self.len).min(bits);
        match self.addr {
            IpAddr::V4(a) => {
                IpAddr::V4((u32::from(a) & u32::MAX.checked_shl(host(32)).unwrap_or(0)).into())
            }
            IpAddr::V6(a) => {
                IpAddr::V6((u128::from(a) & u128::MAX.checked_shl(host(128)).unwrap_or(0)).into())
            }
        }
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// The `own_device` of rule `field`.
pub(super) fn own_device(
    cx: &Ctx,
    raw: &Spanned<RawOwnDevice>,
    field: &str,
) -> Result<OwnDevice, PolicyError> {
    let field = format!("{field}.own_device");
    let r = raw.get_ref();
    let name = r.name.as_ref().ok_or_else(|| {
        cx.err(
            raw.span(),
            &format!("{field}.name"),
            "missing; expected the soft-RoCE device's name, e.g. name = \"rxe_a\"",
        )
    })?;
    ifname(cx, name, &format!("{field}.name"), "soft-RoCE device")?;
    let iface = match &r.interface {
        Some(i) => ifname(cx, i, &format!("{field}.interface"), "network device")?,
        None => name.get_ref().clone(),
    };
    let address = r.address.as_ref().ok_or_else(|| {
        cx.err(
            raw.span(),
            &format!("{field}.address"),
            "missing; expected the device's address with its prefix, e.g. address = \"192.0.2.11/24\" (or a list)",
        )
    })?;
    let addrs = addresses(cx, address, &format!("{field}.address"))?;
    let gateways = match &r.gateway {
        Some(g) => vec![gateway(cx, g, &addrs, &format!("{field}.gateway"))?],
        None => Vec::new(),
    };
    Ok(OwnDevice {
        name: name.get_ref().clone(),
        iface,
        addrs,
        gateways,
    })
}

/// A name that is both a valid network device name and a valid RDMA
/// device name: letters, digits, `_` and `-`, at most 15 bytes.
fn ifname(cx: &Ctx, n: &Spanned<String>, field: &str, what: &str) -> Result<String, PolicyError> {
    let name = n.get_ref();
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > MAX_IFNAME || !name.chars().all(valid) {
        return Err(cx.err(
            n.span(),
            field,
            format!(
                "`{name}` is no {what} name; expected 1 to {MAX_IFNAME} letters, digits, `_` or `-`"
            ),
        ));
    }
    Ok(name.clone())
}

/// `"192.0.2.11/24"` or a list of such.
fn addresses(cx: &Ctx, a: &Spanned<toml::Value>, field: &str) -> Result<Vec<Prefix>, PolicyError> {
    let texts: Vec<&str> = match a.get_ref() {
        toml::Value::String(s) => vec![s.as_str()],
        toml::Value::Array(list) if !list.is_empty() && list.iter().all(|v| v.is_str()) => {
            list.iter().filter_map(toml::Value::as_str).collect()
        }
        other => {
            return Err(cx.err(
                a.span(),
                field,
                format!(
                    "`{other}` is no address; expected \"ADDRESS/PREFIX\" or a list of them, e.g. \"192.0.2.11/24\""
                ),
            ));
        }
    };
    let mut out: Vec<Prefix> = Vec::new();
    for text in texts {
        let p = prefix(text).map_err(|why| cx.err(a.span(), field, format!("`{text}` {why}")))?;
        if out.iter().any(|q| q.addr == p.addr) {
            return Err(cx.err(
                a.span(),
                field,
                format!("{} is given twice; expected each address once", p.addr),
            ));
        }
        out.push(p);
    }
    Ok(out)
}

/// An address with its prefix length, one a host may hold as its own.
fn prefix(text: &str) -> Result<Prefix, String> {
    let (addr, len) = text
        .split_once('/')
        .ok_or("has no prefix length; expected ADDRESS/PREFIX, e.g. 192.0.2.11/24")?;
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| format!("`{addr}` is no IPv4 or IPv6 address"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| (1..=max).contains(l))
        .ok_or_else(|| format!("has prefix length `{len}`; expected 1..={max}"))?;
    let own = match addr {
        IpAddr::V4(a) => {
            !(a.is_unspecified()
                || a.is_loopback()
                || a.is_multicast()
                || a.is_broadcast()
                || a.is_link_local())
        }
        // Every interface has its link-local address (and GID) already.
        IpAddr::V6(a) => {
            !(a.is_unspecified()
                || a.is_loopback()
                || a.is_multicast()
                || a.is_unicast_link_local())
        }
    };
    if !own {
        return Err(
            "is no address a device can hold as its own; expected a unicast address (not loopback, link-local or multicast)"
                .to_string(),
        );
    }
    Ok(Prefix { addr, len })
}

/// A gateway within one of the device's prefixes of its family.
fn gateway(
    cx: &Ctx,
    g: &Spanned<String>,
    addrs: &[Prefix],
    field: &str,
) -> Result<IpAddr, PolicyError> {
    let addr: IpAddr = g.get_ref().parse().map_err(|_| {
        cx.err(
            g.span(),
            field,
            format!("`{}` is no IPv4 or IPv6 address", g.get_ref()),
        )
    })?;
    if !addrs.iter().any(|p| p.contains(addr) && p.addr != addr) {
        let own: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        return Err(cx.err(
            g.span(),
            field,
            format!(
                "{addr} is in none of the device's prefixes ({}); expected a router on one of them",
                own.join(", ")
            ),
        ));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests;
