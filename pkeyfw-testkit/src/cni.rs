//! A CNI runtime, as libcni runs a network configuration list (the
//! specification's section 3), for the CNI lab's pods that are plain
//! network namespaces: ADD runs the plugins in turn, each given the one
//! before's result as `prevResult`, and caches the last result; CHECK runs
//! them in turn with the cached result; DEL runs them in reverse with it
//! (or none) and then forgets it; a failed ADD is followed by DEL. Each
//! plugin is the executable of its `type` in the plugin directory, given
//! its configuration on stdin and the attachment in `CNI_*` variables.

use std::{
    fs,
    io::Write as _,
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::{Map, Value, json};

/// Where the runtime finds networks and plugins and keeps ADD's results.
pub struct Runtime {
    /// Network configuration lists, `NAME.conflist`.
    pub conf_dir: PathBuf,
    /// The plugins' executables (`CNI_PATH`).
    pub bin_dir: PathBuf,
    /// ADD's results, one file per attachment.
    pub cache_dir: PathBuf,
}

/// One pod's interface on a network, as the `CNI_*` variables name it.
pub struct Attachment<'a> {
    pub container_id: &'a str,
    pub netns: &'a str,
    pub ifname: &'a str,
    /// `CNI_ARGS`.
    pub args: &'a str,
}

/// What a plugin answered: whether it succeeded, and its stdout (a
/// result, or an error object).
pub struct Reply {
    pub ok: bool,
    pub stdout: String,
}

/// A network configuration list.
pub struct Network {
    pub name: String,
    cni_version: Value,
    plugins: Vec<Map<String, Value>>,
}

impl Network {
    /// The request configuration of plugin `index`: its own, with the
    /// list's name and version (or `version`) and `prev` as `prevResult`.
    pub fn request(
        &self,
        index: usize,
        version: Option<&str>,
        prev: Option<&Value>,
    ) -> Result<Value> {
        let mut conf = self
            .plugins
            .get(index)
            .with_context(|| format!("network {} has no plugin {index}", self.name))?
            .clone();
        conf.insert(
            "cniVersion".into(),
            version.map_or_else(|| self.cni_version.clone(), Value::from),
        );
        conf.insert("name".into(), self.name.clone().into());
        if let Some(prev) = prev {
            conf.insert("prevResult".into(), prev.clone());
        }
        Ok(Value::Object(conf))
    }
}

impl Runtime {
    /// The network `name`, from its `.conflist`.
    pub fn network(&self, name: &str) -> Result<Network> {
        let path = self.conf_dir.join(format!("{name}.conflist"));
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let list: Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let plugins = list["plugins"]
            .as_array()
            .with_context(|| format!("{}: no plugins", path.display()))?
            .iter()
            .map(|p| p.as_object().cloned().context("a plugin that is no object"))
            .collect::<Result<_>>()?;
        Ok(Network {
            name: name.to_string(),
            cni_version: list["cniVersion"].clone(),
            plugins,
        })
    }

    /// ADD: the final result, cached for CHECK and DEL; a plugin's
    /// failure, after DEL of the whole list.
    pub fn add(&self, net: &Network, at: &Attachment) -> Result<Reply> {
        let mut prev: Option<Value> = None;
        for index in 0..net.plugins.len() {
            let reply = self.invoke("ADD", net, index, prev.as_ref(), at)?;
            if !reply.ok {
                self.del(net, at)?;
                return Ok(reply);
            }
            prev = Some(
                serde_json::from_str(&reply.stdout)
                    .with_context(|| format!("plugin {index}'s result: {}", reply.stdout))?,
            );
        }
        let result = prev.map(|r| r.to_string()).unwrap_or_default();
        fs::create_dir_all(&self.cache_dir)?;
        fs::write(self.cache(net, at), &result)?;
        Ok(Reply {
            ok: true,
            stdout: result,
        })
    }

    /// CHECK, with ADD's cached result; stops at the first failure.
    pub fn check(&self, net: &Network, at: &Attachment) -> Result<Reply> {
        let prev = self
            .cached(net, at)?
            .with_context(|| format!("no cached result of {} on {}", at.container_id, net.name))?;
        self.each("CHECK", net, 0..net.plugins.len(), Some(&prev), at)
    }

    /// DEL, in reverse, with ADD's cached result if any, which then goes;
    /// stops at the first failure.
    pub fn del(&self, net: &Network, at: &Attachment) -> Result<Reply> {
        let prev = self.cached(net, at)?;
        let reply = self.each("DEL", net, (0..net.plugins.len()).rev(), prev.as_ref(), at)?;
        if reply.ok {
            let _ = fs::remove_file(self.cache(net, at));
        }
        Ok(reply)
    }

    /// ADD's cached result of `at` on `net`, if any.
    pub fn cached(&self, net: &Network, at: &Attachment) -> Result<Option<Value>> {
        match fs::read_to_string(self.cache(net, at)) {
            Ok(text) => Ok(Some(serde_json::from_str(&text)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn cache(&self, net: &Network, at: &Attachment) -> PathBuf {
        self.cache_dir.join(format!(
            "{}-{}-{}.json",
            net.name, at.container_id, at.ifname
        ))
    }

    /// `command` of the plugins `indices`, in that order, until one fails.
    fn each(
        &self,
        command: &str,
        net: &Network,
        indices: impl Iterator<Item = usize>,
        prev: Option<&Value>,
        at: &Attachment,
    ) -> Result<Reply> {
        let mut last = Reply {
            ok: true,
            stdout: String::new(),
        };
        for index in indices {
            last = self.invoke(command, net, index, prev, at)?;
            if !last.ok {
                break;
            }
        }
        Ok(last)
    }

    /// `command` (ADD, CHECK, DEL) of plugin `index` alone.
    pub fn invoke(
        &self,
        command: &str,
        net: &Network,
        index: usize,
        prev: Option<&Value>,
        at: &Attachment,
    ) -> Result<Reply> {
        let conf = net.request(index, None, prev)?;
        self.exec(
            &conf,
            &[
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", at.container_id),
                ("CNI_NETNS", at.netns),
                ("CNI_IFNAME", at.ifname),
                ("CNI_ARGS", at.args),
            ],
        )
    }

    /// GC (CNI 1.1.0) of plugin `index` of `net`: every attachment of the
    /// network but `valid` (container ID, interface) goes.
    pub fn gc(
        &self,
        net: &Network,
        index: usize,
        version: &str,
        valid: &[(&str, &str)],
    ) -> Result<Reply> {
        let mut conf = net.request(index, Some(version), None)?;
        conf["cni.dev/valid-attachments"] = valid
            .iter()
            .map(|(id, ifname)| json!({"containerID": id, "ifname": ifname}))
            .collect();
        self.exec(&conf, &[("CNI_COMMAND", "GC")])
    }

    /// VERSION of the plugin `plugin`, asked in `version`.
    pub fn version(&self, plugin: &str, version: &str) -> Result<Reply> {
        let conf = json!({"cniVersion": version, "type": plugin});
        self.exec(&conf, &[("CNI_COMMAND", "VERSION")])
    }

    /// Runs the plugin of `conf`'s type with `conf` on stdin and `env`.
    fn exec(&self, conf: &Value, env: &[(&str, &str)]) -> Result<Reply> {
        let kind = conf["type"].as_str().context("a plugin without a type")?;
        let path = self.bin_dir.join(kind);
        let mut child = Command::new(&path)
            .envs(env.iter().copied())
            .env("CNI_PATH", &self.bin_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", path.display()))?;
        child
            .stdin
            .take()
            .ok_or_else(|| anyhow!("no stdin"))?
            .write_all(conf.to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        Ok(Reply {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        })
    }
}

/// A field of a CNI result or error object, as the lab's checks read it.
pub fn field(value: &Value, name: &str) -> Result<String> {
    let interfaces = |sandboxed: bool| -> Vec<&str> {
        value["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i.get("sandbox").is_some_and(|s| !s.is_null()) == sandboxed)
            .filter_map(|i| i["name"].as_str())
            .collect()
    };
    let text = match name {
        // The pod's RDMA device: the sandboxed interface before its own.
        "device" => interfaces(true).iter().rev().nth(1).map(|s| s.to_string()),
        // The pod's bridge port: the host's interface after the bridge.
        "port" => interfaces(false).get(1).map(|s| s.to_string()),
        "sandboxed" => Some(interfaces(true).join(" ")),
        // The pod's IPv4 address, without its prefix length.
        "address" => value["ips"][0]["address"]
            .as_str()
            .map(|a| a.split('/').next().unwrap_or(a).to_string()),
        // The name of the interface the first address is on.
        "ip-interface" => value["ips"][0]["interface"]
            .as_u64()
            .and_then(|i| value["interfaces"][i as usize]["name"].as_str())
            .map(str::to_string),
        "cni-version" => value["cniVersion"].as_str().map(str::to_string),
        "supported-versions" => value["supportedVersions"].as_array().map(|v| {
            v.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        }),
        "code" => value["code"].as_u64().map(|c| c.to_string()),
        _ => bail!(
            "no field {name}: device, port, sandboxed, address, ip-interface, \
             cni-version, supported-versions or code"
        ),
    };
    text.with_context(|| format!("no {name} in {value}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime over two plugins that answer their prevResult's `seen`
    /// list with their own name added, and log each call.
    fn lab(dir: &std::path::Path, fail: &str) -> Runtime {
        let rt = Runtime {
            conf_dir: dir.join("conf"),
            bin_dir: dir.join("bin"),
            cache_dir: dir.join("cache"),
        };
        fs::create_dir_all(&rt.conf_dir).unwrap();
        fs::create_dir_all(&rt.bin_dir).unwrap();
        fs::write(
            rt.conf_dir.join("n.conflist"),
            r#"{"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "one"}, {"type": "two"}]}"#,
        )
        .unwrap();
        for name in ["one", "two"] {
            let path = rt.bin_dir.join(name);
            // stdin is one line of JSON: note the call, answer with `seen`.
            let script = format!(
                "#!/bin/sh\nread conf\necho \"$CNI_COMMAND {name} $CNI_CONTAINERID $conf\" >> {log}\n\
                 [ \"$CNI_COMMAND/{name}\" = {fail} ] && {{ echo '{{\"code\": 7}}'; exit 1; }}\n\
                 seen=$(echo \"$conf\" | sed -n 's/.*\"seen\":\\[\\([^]]*\\)\\].*/\\1/p')\n\
                 echo \"{{\\\"cniVersion\\\": \\\"1.0.0\\\", \\\"seen\\\": [${{seen:+$seen,}}\\\"{name}\\\"]}}\"\n",
                log = dir.join("log").display(),
            );
            fs::write(&path, script).unwrap();
            Command::new("chmod").arg("+x").arg(&path).status().unwrap();
        }
        rt
    }

    fn calls(dir: &std::path::Path) -> Vec<String> {
        let log = fs::read_to_string(dir.join("log")).unwrap_or_default();
        let _ = fs::remove_file(dir.join("log"));
        log.lines().map(str::to_string).collect()
    }

    /// Each call's command and plugin.
    fn steps(log: &[String]) -> Vec<&str> {
        log.iter().map(|l| &l[..l.find(" c ").unwrap()]).collect()
    }

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pkeyfw-cni-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    const AT: Attachment = Attachment {
        container_id: "c",
        netns: "/run/netns/c",
        ifname: "eth0",
        args: "",
    };

    #[test]
    fn results_thread_from_plugin_to_plugin() {
        let dir = dir("thread");
        let rt = lab(&dir, "none");
        let net = rt.network("n").unwrap();
        let add = rt.add(&net, &AT).unwrap();
        assert!(add.ok);
        assert_eq!(add.stdout, r#"{"cniVersion":"1.0.0","seen":["one","two"]}"#);
        let log = calls(&dir);
        assert_eq!(log.len(), 2);
        assert!(log[0].starts_with("ADD one c ") && !log[0].contains("prevResult"));
        assert!(
            log[1].starts_with("ADD two c ")
                && log[1].contains(r#""prevResult":{"cniVersion":"1.0.0","seen":["one"]}"#)
        );
        // CHECK in order and DEL in reverse, each with the cached result.
        assert!(rt.check(&net, &AT).unwrap().ok);
        assert!(rt.del(&net, &AT).unwrap().ok);
        let log = calls(&dir);
        assert_eq!(
            steps(&log),
            ["CHECK one", "CHECK two", "DEL two", "DEL one"]
        );
        assert!(log.iter().all(|l| l.contains(r#""seen":["one","two"]"#)));
        assert!(rt.cached(&net, &AT).unwrap().is_none());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_add_is_deleted() {
        let dir = dir("failed");
        let rt = lab(&dir, "ADD/two");
        let net = rt.network("n").unwrap();
        let add = rt.add(&net, &AT).unwrap();
        assert!(!add.ok);
        assert_eq!(
            field(&serde_json::from_str(&add.stdout).unwrap(), "code").unwrap(),
            "7"
        );
        let log = calls(&dir);
        assert_eq!(steps(&log), ["ADD one", "ADD two", "DEL two", "DEL one"]);
        // With nothing cached, DEL has no prevResult.
        assert!(!log[2].contains("prevResult") && !log[3].contains("prevResult"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fields_of_a_result() {
        let result = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "roce0"}, {"name": "veth1"}, {"name": "pkfw3", "sandbox": "/run/netns/a"},
                {"name": "eth0", "sandbox": "/run/netns/a"}
            ],
            "ips": [{"address": "10.77.0.10/24", "interface": 3}]
        });
        let f = |name| field(&result, name).unwrap();
        assert_eq!(f("device"), "pkfw3");
        assert_eq!(f("port"), "veth1");
        assert_eq!(f("sandboxed"), "pkfw3 eth0");
        assert_eq!(f("address"), "10.77.0.10");
        assert_eq!(f("ip-interface"), "eth0");
        assert_eq!(f("cni-version"), "1.0.0");
        assert!(field(&result, "code").is_err());
    }
}
