//! Which driver runs an RDMA device, as sysfs tells it
//! (`/sys/class/infiniband/DEV`): whether its RoCE traffic crosses the
//! interface's network stack, where pkeyfw's programs run, or is handled
//! in a NIC that they never see.

use std::{fmt, path::Path};

/// Where the kernel lists RDMA devices.
const CLASS: &str = "/sys/class/infiniband";

/// The driver behind an RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Driver {
    /// Soft-RoCE: its frames are sent and received through the netdev, so
    /// XDP and TC see them.
    Rxe,
    /// A device with a driver bound to it (`mlx5_core`, `bnxt_en`, `irdma`,
    /// …): the NIC handles its RDMA traffic, which never passes through XDP
    /// or TC.
    Hardware(String),
    /// sysfs shows neither (soft iWARP, a device gone meanwhile, a device
    /// in another network namespace's sysfs).
    Unknown,
}

impl Driver {
    /// The driver of the RDMA device `name`.
    pub fn of(name: &str) -> Driver {
        Driver::read(Path::new(CLASS), name)
    }

    /// The driver of device `name` in the sysfs class directory `class`.
    /// rdma_rxe's own `parent` attribute is asked first: before Linux 5.11
    /// rxe made the netdev's own device its parent, whose `driver` is the
    /// NIC's.
    pub fn read(class: &Path, name: &str) -> Driver {
        let dir = class.join(name);
        if dir.join("parent").is_file() {
            return Driver::Rxe;
        }
        match std::fs::read_link(dir.join("device/driver")) {
            Ok(target) => target
                .file_name()
                .map(|n| Driver::Hardware(n.to_string_lossy().into_owned()))
                .unwrap_or(Driver::Unknown),
            Err(_) => Driver::Unknown,
        }
    }

    /// Whether the device's RoCE traffic passes through the interface's
    /// XDP and TC programs.
    pub fn in_reach(&self) -> bool {
        *self == Driver::Rxe
    }

    /// The driver's module name, when known.
    pub fn name(&self) -> Option<&str> {
        match self {
            Driver::Rxe => Some("rdma_rxe"),
            Driver::Hardware(name) => Some(name),
            Driver::Unknown => None,
        }
    }
}

/// The driver's module name, or `driver unknown`.
impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().unwrap_or("driver unknown"))
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::symlink, path::Path};

    use super::Driver;

    /// A sysfs tree as Linux 6.x lays it out: `class/infiniband/DEV` links
    /// to the device under `devices/`, a PCI NIC's device links its parent
    /// function (`device`), which links its driver; rxe is a virtual device
    /// with its netdev in `parent`.
    fn sysfs(root: &Path) {
        let pci = root.join("devices/pci0000:00/0000:00:02.0/0000:03:00.0");
        let virt = root.join("devices/virtual/infiniband");
        let class = root.join("class/infiniband");
        for dir in [
            root.join("bus/pci/drivers/mlx5_core"),
            root.join("bus/virtio/drivers/virtio_net"),
            root.join("devices/pci0000:00/0000:00:03.0/virtio0"),
            pci.join("infiniband/mlx5_0"),
            virt.join("rxe0"),
            virt.join("rxe1"),
            virt.join("siw0"),
            class.clone(),
        ] {
            fs::create_dir_all(dir).unwrap();
        }
        symlink("../../../../bus/pci/drivers/mlx5_core", pci.join("driver")).unwrap();
        symlink(
            "../../../0000:03:00.0",
            pci.join("infiniband/mlx5_0/device"),
        )
        .unwrap();
        fs::write(virt.join("rxe0/parent"), "eth1\n").unwrap();
        // Before 5.11 rxe's parent was the netdev's device (here a virtio
        // NIC's), with a driver of its own.
        fs::write(virt.join("rxe1/parent"), "eth2\n").unwrap();
        symlink(
            "../../../../bus/virtio/drivers/virtio_net",
            root.join("devices/pci0000:00/0000:00:03.0/virtio0/driver"),
        )
        .unwrap();
        symlink(
            "../../../pci0000:00/0000:00:03.0/virtio0",
            virt.join("rxe1/device"),
        )
        .unwrap();
        let links = [
            (
                "mlx5_0",
                "../../devices/pci0000:00/0000:00:02.0/0000:03:00.0/infiniband/mlx5_0",
            ),
            ("rxe0", "../../devices/virtual/infiniband/rxe0"),
            ("rxe1", "../../devices/virtual/infiniband/rxe1"),
            ("siw0", "../../devices/virtual/infiniband/siw0"),
        ];
        for (name, target) in links {
            symlink(target, class.join(name)).unwrap();
        }
    }

    #[test]
    fn drivers_from_sysfs() {
        let root = tempfile::tempdir().unwrap();
        sysfs(root.path());
        let class = root.path().join("class/infiniband");
        let mlx5 = Driver::read(&class, "mlx5_0");
        assert_eq!(mlx5, Driver::Hardware("mlx5_core".into()));
        assert!(!mlx5.in_reach());
        assert_eq!(mlx5.to_string(), "mlx5_core");
        assert_eq!(Driver::read(&class, "rxe0"), Driver::Rxe);
        assert!(Driver::Rxe.in_reach());
        assert_eq!(Driver::Rxe.to_string(), "rdma_rxe");
        // Not the virtio NIC's driver.
        assert_eq!(Driver::read(&class, "rxe1"), Driver::Rxe);
        // Neither a parent nor a device: no claim either way.
        assert_eq!(Driver::read(&class, "siw0"), Driver::Unknown);
        assert!(!Driver::Unknown.in_reach());
        // Gone since nldev listed it.
        assert_eq!(Driver::read(&class, "mlx5_1"), Driver::Unknown);
    }
}
