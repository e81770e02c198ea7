//! What loading every program of an attachment costs the kernel:
//! `pkeyfw kernel --programs`, the bench and the verifier-budget test read
//! the same figures.

use std::path::Path;

use anyhow::{Context as _, Result};
use pkeyfw_common::abi::{NO_DEVICE, SenderLayout};

use crate::{
    control::{probes, tenancy},
    loading::{
        cost::Cost,
        features::Features,
        filter::{Filter, Load},
        pins,
    },
};

/// Loads every program an attachment loads, for a host's port or a
/// switch's (`switch`), pinned in a scratch directory of bpffs (the probes
/// reach the filter's maps through pins), and returns what each cost;
/// nothing is attached, and everything is gone when it returns.
pub fn measure(switch: bool) -> Result<Vec<Cost>> {
    pins::ensure_bpffs()?;
    let dir = Path::new(pins::BPFFS).join(format!("pkeyfw-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let measured = (|| {
        // As on a host with an rdma_rxe device: offsets as plausible as any,
        // where a layout of none would let the verifier drop the code that
        // tells which QP sent a frame.
        let sender = SenderLayout {
            skb_sk: 8,
            sk_user_data: 8,
            rxe_ibqp: 8,
            rxe_sk: 8,
            socket_sk: 8,
            qp_device: 8,
            qp_num: 8,
            device_index: 8,
            devices: [0, NO_DEVICE, NO_DEVICE, NO_DEVICE],
        };
        let filter = Filter::load_with(&Load {
            switch,
            pin: Some(&dir),
            sender,
            ..Load::host(0)
        })?;
        let mut costs = filter.costs()?;
        // The probes are a host port's, on kernels that can run them, and
        // so is the device guard of a host whose tenants have devices of
        // their own.
        if !switch && Features::probe().rdma_probes {
            costs.extend(probes::costs(&dir)?);
            costs.push(tenancy::guard::cost()?);
        }
        Ok(costs)
    })();
    // Unpinned, the programs and maps go with the last file descriptor.
    let _ = std::fs::remove_dir_all(&dir);
    measured
}
