//! Where pkeyfw enforces nothing: the RDMA devices bound to an interface,
//! each named with its driver, and a warning for each whose RDMA traffic
//! never passes through the interface's XDP or TC programs (a hardware
//! RoCE NIC handles it itself). `attach`, `qps` and `policy check --iface`
//! say it alike.

use anyhow::Error;
use serde_json::{Value, json};

use crate::host::rdma::{Device, Driver, NoRdmaNetlink};

/// What to say of an interface's RDMA devices: a line naming them (none
/// when it has none) and the warnings.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reach {
    pub line: Option<String>,
    pub warnings: Vec<String>,
}

impl Reach {
    /// Of `iface`'s devices as read, or as failed to be read. A kernel
    /// without RDMA netlink has no RDMA device: nothing to say.
    pub fn of(iface: &str, devices: Result<&[Device], &Error>) -> Reach {
        match devices {
            Ok([]) => Reach::default(),
            Ok(devices) => Reach {
                line: Some(format!("RDMA devices on {iface}: {}", named(devices))),
                warnings: devices.iter().filter_map(warning).collect(),
            },
            Err(e) if e.downcast_ref::<NoRdmaNetlink>().is_some() => Reach::default(),
            Err(e) => Reach {
                line: None,
                warnings: vec![format!(
                    "cannot list the RDMA devices on {iface} ({e:#}): whether a hardware device's traffic bypasses pkeyfw there is unknown"
                )],
            },
        }
    }
}

/// `rxe0 (rdma_rxe), mlx5_0 (mlx5_core)`.
pub fn named(devices: &[Device]) -> String {
    let names: Vec<String> = devices
        .iter()
        .map(|d| format!("{} ({})", d.name, d.driver))
        .collect();
    names.join(", ")
}

/// Why pkeyfw enforces nothing on `device`'s traffic, unless it does.
pub fn warning(device: &Device) -> Option<String> {
    const ELSEWHERE: &str = "enforce its partitions at a switch port its traffic crosses (`pkeyfw switch`, see the README)";
    match &device.driver {
        Driver::Rxe => None,
        Driver::Hardware(driver) => Some(format!(
            "{} ({driver}) is a hardware RDMA device: the NIC handles its RDMA traffic, which never passes through XDP or TC, so pkeyfw enforces nothing on it; {ELSEWHERE}",
            device.name
        )),
        Driver::Unknown => Some(format!(
            "{}: sysfs names no driver for it (neither rdma_rxe's parent nor a device driver), so whether its traffic passes through XDP or TC is unknown; if the NIC handles it, pkeyfw enforces nothing on it: {ELSEWHERE}",
            device.name
        )),
    }
}

/// A device, as `qps --json` and `policy check --json` show it.
pub fn device_json(d: &Device) -> Value {
    json!({
        "name": d.name,
        "index": d.index,
        "ports": d.ports,
        "driver": d.driver.name(),
        "in_reach": d.driver.in_reach(),
    })
}

#[cfg(test)]
mod tests {
    use anyhow::anyhow;

    use super::{Reach, device_json};
    use crate::host::rdma::{Device, Driver, NoRdmaNetlink};

    fn device(index: u32, name: &str, driver: Driver) -> Device {
        Device {
            index,
            name: name.into(),
            ports: vec![1],
            port_count: 1,
            driver,
        }
    }

    #[test]
    fn rxe_is_named_without_a_warning() {
        let rxe = [device(3, "rxe0", Driver::Rxe)];
        let reach = Reach::of("veth0", Ok(&rxe));
        assert_eq!(
            reach.line.as_deref(),
            Some("RDMA devices on veth0: rxe0 (rdma_rxe)")
        );
        assert!(reach.warnings.is_empty(), "{:?}", reach.warnings);
        assert_eq!(
            device_json(&rxe[0]),
            serde_json::json!({"name": "rxe0", "index": 3, "ports": [1], "driver": "rdma_rxe", "in_reach": true})
        );
    }

    #[test]
    fn hardware_is_out_of_reach() {
        let both = [
            device(0, "mlx5_0", Driver::Hardware("mlx5_core".into())),
            device(1, "rxe0", Driver::Rxe),
            device(2, "siw0", Driver::Unknown),
        ];
        let reach = Reach::of("eth0", Ok(&both));
        assert_eq!(
            reach.line.as_deref(),
            Some(
                "RDMA devices on eth0: mlx5_0 (mlx5_core), rxe0 (rdma_rxe), siw0 (driver unknown)"
            )
        );
        let [mlx5, siw] = reach.warnings.as_slice() else {
            panic!("{:?}", reach.warnings)
        };
        assert!(mlx5.starts_with("mlx5_0 (mlx5_core) is a hardware RDMA device"));
        assert!(mlx5.contains("never passes through XDP or TC, so pkeyfw enforces nothing on it"));
        assert!(mlx5.contains("`pkeyfw switch`"));
        assert!(siw.starts_with("siw0: sysfs names no driver"));
        assert!(siw.contains("`pkeyfw switch`"));
        assert_eq!(device_json(&both[0])["driver"], "mlx5_core");
        assert_eq!(device_json(&both[0])["in_reach"], false);
        assert_eq!(device_json(&both[2])["driver"], serde_json::Value::Null);
    }

    #[test]
    fn no_device_no_word() {
        assert_eq!(Reach::of("veth0", Ok(&[])), Reach::default());
        // No ib_core: no RDMA device can exist.
        let absent = anyhow!(NoRdmaNetlink);
        assert_eq!(Reach::of("veth0", Err(&absent)), Reach::default());
        // Anything else leaves the question open, and says so.
        let refused = anyhow!("RDMA netlink refused the request");
        let reach = Reach::of("veth0", Err(&refused));
        assert_eq!(reach.line, None);
        assert_eq!(reach.warnings.len(), 1);
        assert!(reach.warnings[0].starts_with("cannot list the RDMA devices on veth0"));
    }
}
