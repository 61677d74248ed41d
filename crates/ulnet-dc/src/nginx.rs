//! An adapter that lets the helper module drive Debian's nginx in either role, as the
//! thesis' helpers drove unmodified Apache: it rewrites nginx's configuration and reloads
//! it gracefully (`nginx -s reload`: new workers take new connections, old workers finish
//! their requests and exit), so a role change drops no request.
//!
//! - *proxy*: `proxy_cache` of static documents (`/{site}/s/{doc}`), `X-Cache` telling
//!   HIT/MISS, dynamic requests (`/{site}/d/{txn}`) passed through uncached, to an
//!   `upstream` of the application nodes of its site (keep-alive, next upstream on error).
//! - *app*: static documents from a document root, dynamic pages made per request.
//!
//! [`Sidecar`] is the helper beside one nginx: it follows the role table announced to its
//! node, reconfigures nginx when the node's role or its site's application nodes change,
//! and publishes the node's load record from nginx's `stub_status`.

use crate::http::Conn;
use crate::load::LoadRecord;
use crate::role::{NodeIndex, Role, RoleTable, Tier};
use crate::state::{epoch_after, SharedState};
use std::fmt::Write as _;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why nginx could not be driven.
#[derive(Debug, thiserror::Error)]
pub enum NginxError {
    /// Files or processes.
    #[error("nginx: {0}")]
    Io(#[from] std::io::Error),
    /// nginx refused the configuration or a signal.
    #[error("nginx {action} failed: {stderr}")]
    Command {
        /// What was asked.
        action: &'static str,
        /// What nginx said.
        stderr: String,
    },
    /// nginx did not start listening in time.
    #[error("nginx did not listen on {0} within 5 s")]
    NotListening(SocketAddr),
}

/// What one nginx serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NginxRole {
    /// Caching proxy in front of these application servers.
    Proxy {
        /// The application nodes of its site.
        app_servers: Vec<SocketAddr>,
    },
    /// Web/application server.
    App,
}

/// Where and how an nginx runs.
#[derive(Clone, Debug)]
pub struct NginxConfig {
    /// The nginx binary (Debian: `/usr/sbin/nginx`).
    pub binary: PathBuf,
    /// Its own directory: configuration, pid file, logs, temp and cache directories.
    pub dir: PathBuf,
    /// Document root of the application role (files `{root}/{site}/{doc}`).
    pub docroot: PathBuf,
    /// Address it listens on.
    pub listen: SocketAddrV4,
    /// Worker processes.
    pub workers: u16,
}

/// A running nginx master process this adapter started.
pub struct NginxNode {
    config: NginxConfig,
    role: NginxRole,
    master: Child,
    reloads: u64,
}

/// The configuration file for `role`.
pub fn render(config: &NginxConfig, role: &NginxRole) -> String {
    let d = config.dir.display();
    let mut c = String::new();
    let _ = write!(
        c,
        "# Written by ulnet-dc; rewritten on every role change.\n\
         worker_processes {};\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/tmp/body;\n  proxy_temp_path {d}/tmp/proxy;\n\
         \x20 fastcgi_temp_path {d}/tmp/fastcgi;\n  uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n\
         \x20 keepalive_requests 100000;\n",
        config.workers
    );
    match role {
        NginxRole::Proxy { app_servers } => {
            let _ = write!(
                c,
                "  proxy_cache_path {d}/cache levels=1:2 keys_zone=docs:8m max_size=64m inactive=10m use_temp_path=off;\n\
                 \x20 upstream app {{\n"
            );
            for s in app_servers {
                let _ = writeln!(c, "    server {s} max_fails=0;");
            }
            let _ = write!(
                c,
                "    keepalive 32;\n  }}\n  server {{\n    listen {};\n\
                 \x20   proxy_http_version 1.1;\n    proxy_set_header Connection \"\";\n    proxy_set_header X-Ulnet-Tier app;\n\
                 \x20   proxy_next_upstream error timeout http_502 http_503;\n\
                 \x20   location ~ ^/[0-9]+/s/[0-9]+$ {{ proxy_pass http://app; proxy_cache docs; proxy_cache_valid 200 10m; \
                 proxy_cache_lock on; add_header X-Cache $upstream_cache_status; }}\n\
                 \x20   location ~ ^/[0-9]+/d/[0-9]+$ {{ proxy_pass http://app; add_header X-Cache PASS; }}\n\
                 \x20   location = /nginx_status {{ stub_status; }}\n  }}\n}}\n",
                config.listen
            );
        }
        NginxRole::App => {
            let _ = write!(
                c,
                "  server {{\n    listen {};\n    root {};\n    default_type application/octet-stream;\n\
                 \x20   location ~ ^/([0-9]+)/s/([0-9]+)$ {{ try_files /$1/$2 =404; }}\n\
                 \x20   location ~ ^/([0-9]+)/d/([0-9]+)$ {{ default_type text/plain; \
                 return 200 \"site $1 transaction $2 computed by nginx $server_port at $msec\\n\"; }}\n\
                 \x20   location = /nginx_status {{ stub_status; }}\n  }}\n}}\n",
                config.listen,
                config.docroot.display()
            );
        }
    }
    c
}

fn conf_path(dir: &Path) -> PathBuf {
    dir.join("nginx.conf")
}

impl NginxNode {
    /// Writes the configuration for `role`, checks it, and starts nginx in the foreground
    /// of a child process (so the adapter owns it).
    pub fn start(config: NginxConfig, role: NginxRole) -> Result<NginxNode, NginxError> {
        for sub in ["tmp", "cache", "logs"] {
            let d = config.dir.join(sub);
            std::fs::create_dir_all(&d)?;
            // Started as root, nginx's workers run as an unprivileged user that must write here.
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
        }
        std::fs::write(conf_path(&config.dir), render(&config, &role))?;
        Self::command(&config, &["-t"], "configuration test")?;
        let master = Command::new(&config.binary)
            .arg("-p")
            .arg(&config.dir)
            .arg("-c")
            .arg(conf_path(&config.dir))
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let node = NginxNode { config, role, master, reloads: 0 };
        let addr = SocketAddr::V4(node.config.listen);
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if Instant::now() > deadline {
                return Err(NginxError::NotListening(addr));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(node)
    }

    fn command(config: &NginxConfig, args: &[&str], action: &'static str) -> Result<(), NginxError> {
        let out = Command::new(&config.binary)
            .arg("-p")
            .arg(&config.dir)
            .arg("-c")
            .arg(conf_path(&config.dir))
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(NginxError::Command {
                action,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    /// The role it serves.
    pub fn role(&self) -> &NginxRole {
        &self.role
    }

    /// Graceful reloads done.
    pub fn reloads(&self) -> u64 {
        self.reloads
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddrV4 {
        self.config.listen
    }

    /// Rewrites the configuration for `role` and reloads gracefully. A configuration nginx
    /// rejects is put back and the old one keeps serving.
    pub fn reconfigure(&mut self, role: NginxRole) -> Result<(), NginxError> {
        if role == self.role {
            return Ok(());
        }
        let path = conf_path(&self.config.dir);
        let old = std::fs::read_to_string(&path)?;
        std::fs::write(&path, render(&self.config, &role))?;
        if let Err(e) = Self::command(&self.config, &["-t"], "configuration test") {
            std::fs::write(&path, old)?;
            return Err(e);
        }
        Self::command(&self.config, &["-s", "reload"], "reload")?;
        self.role = role;
        self.reloads += 1;
        Ok(())
    }

    /// nginx's `stub_status`: (active connections, requests handled so far).
    pub fn status(&self) -> Option<(u32, u64)> {
        let mut c = Conn::connect(SocketAddr::V4(self.config.listen), Duration::from_secs(1)).ok()?;
        let r = c.get("/nginx_status", None).ok()?;
        let text = String::from_utf8(r.body).ok()?;
        let active = text.lines().next()?.split(':').nth(1)?.trim().parse().ok()?;
        let requests = text.lines().nth(2)?.split_whitespace().nth(2)?.parse().ok()?;
        Some((active, requests))
    }

    /// Stops nginx gracefully (`-s quit`: workers finish their requests) and waits for it.
    pub fn stop(mut self) -> Result<(), NginxError> {
        self.shut_down("quit")
    }

    fn shut_down(&mut self, signal: &'static str) -> Result<(), NginxError> {
        if self.master.try_wait()?.is_some() {
            return Ok(());
        }
        let sent = Self::command(&self.config, &["-s", signal], "stop");
        if sent.is_err() {
            self.master.kill().ok();
        }
        self.master.wait()?;
        sent
    }
}

impl Drop for NginxNode {
    /// An nginx this adapter started never outlives it (`-s stop`: fast shutdown).
    fn drop(&mut self) {
        self.shut_down("stop").ok();
    }
}

/// The helper module beside one nginx node.
pub struct Sidecar {
    node: NginxNode,
    index: NodeIndex,
    incarnation: u32,
    table: RoleTable,
    last_status: Option<(Instant, u64)>,
    completed: u64,
}

impl Sidecar {
    /// A sidecar for `node`, which is node `index` of the center.
    pub fn new(node: NginxNode, index: NodeIndex) -> Self {
        Sidecar { node, index, incarnation: rand::random(), table: RoleTable::EMPTY, last_status: None, completed: 0 }
    }

    /// The nginx it drives.
    pub fn node(&self) -> &NginxNode {
        &self.node
    }

    /// Ends the sidecar, returning its nginx.
    pub fn into_node(self) -> NginxNode {
        self.node
    }

    /// One step: take the newest table (announced to this node, or in the role word),
    /// reconfigure nginx if this node's part changed, publish the load record. Returns
    /// whether nginx was reloaded.
    pub fn step(&mut self, state: &dyn SharedState, addrs: &[Option<SocketAddr>]) -> Result<bool, NginxError> {
        let mut table = state.announced().unwrap_or(RoleTable::EMPTY);
        if let Ok(word) = state.read_roles() {
            if table == RoleTable::EMPTY || epoch_after(word.epoch(), table.epoch()) {
                table = word;
            }
        }
        if self.table == RoleTable::EMPTY || epoch_after(table.epoch(), self.table.epoch()) {
            self.table = table;
        }
        let role = self.table.role(self.index);
        let wanted = match role {
            Some(Role { site, tier: Tier::Proxy }) => NginxRole::Proxy {
                app_servers: self
                    .table
                    .nodes_in(Role { site, tier: Tier::App })
                    .filter_map(|n| addrs.get(n.get()).copied().flatten())
                    .collect(),
            },
            _ => NginxRole::App,
        };
        let reloaded = if wanted != *self.node.role() {
            self.node.reconfigure(wanted)?;
            true
        } else {
            false
        };
        let now = Instant::now();
        let (connections, rate) = match self.node.status() {
            Some((active, requests)) => {
                let rate = self.last_status.map_or(0.0, |(t, r)| {
                    let dt = now.duration_since(t).as_secs_f64();
                    if dt > 0.0 {
                        requests.saturating_sub(r) as f64 / dt
                    } else {
                        0.0
                    }
                });
                self.last_status = Some((now, requests));
                self.completed = requests;
                (active, rate)
            }
            None => (0, 0.0),
        };
        let workers = self.node.config.workers;
        // nginx does not report busy workers; its active connections (less the status
        // request itself) bound the requests in service.
        let in_service = connections.saturating_sub(1);
        let record = LoadRecord {
            node: self.index.0,
            incarnation: self.incarnation,
            addr: Some(self.node.addr()),
            serving: role,
            applied_epoch: self.table.epoch(),
            workers,
            busy_milli: (in_service.min(u32::from(workers))) * 1000,
            queued_milli: in_service.saturating_sub(u32::from(workers)) * 1000,
            connections,
            requests_per_s: rate as u32,
            completed: self.completed,
            ..LoadRecord::default()
        };
        state.publish_load(&record).ok();
        Ok(reloaded)
    }
}
