//! Where a node learns its rank, the number of nodes and how to reach node 0, from the
//! launchers clusters already have: Slurm's `srun` and MPI's `mpirun`. (Local processes
//! and `ssh` are started by `ulnet sort` itself, which passes these on the command line.)
//!
//! Every function takes the environment as a lookup function, so the parsing is tested
//! with simulated environments.
//!
//! ```
//! use ulnet_river::sort::launch::{from_slurm, expand_hostlist};
//!
//! let env = |k: &str| match k {
//!     "SLURM_PROCID" => Some("2".to_string()),
//!     "SLURM_NTASKS" => Some("4".into()),
//!     "SLURM_STEP_NODELIST" => Some("cn[07-08,10],gpu1".into()),
//!     "SLURM_NNODES" => Some("4".into()),
//!     "SLURM_JOB_ID" => Some("4242".into()),
//!     "SLURM_STEP_ID" => Some("0".into()),
//!     _ => None,
//! };
//! let p = from_slurm(&env, 7100).unwrap().unwrap();
//! assert_eq!((p.rank, p.size, p.coordinator.as_str()), (2, 4, "cn07:7100"));
//! assert_eq!(expand_hostlist("cn[07-08,10],gpu1").unwrap(), ["cn07", "cn08", "cn10", "gpu1"]);
//! ```

/// What a launcher's environment says about this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// This process's rank.
    pub rank: usize,
    /// Number of processes.
    pub size: usize,
    /// `host:port` where node 0 listens.
    pub coordinator: String,
    /// Whether every process runs on this host (then shared memory connects them).
    pub single_host: bool,
    /// A name shared by every process of the run and by no other run.
    pub job: String,
    /// Which launcher it was.
    pub launcher: &'static str,
}

/// Why a launcher's environment could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LaunchError {
    /// A variable is present but unusable.
    #[error("environment variable {name}={value:?} is not usable: {why}")]
    Bad {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong.
        why: String,
    },
    /// A variable the launcher always sets is missing.
    #[error("environment variable {0} is not set (was this started by the launcher?)")]
    Missing(String),
    /// The coordinator cannot be found from the environment.
    #[error("cannot tell where node 0 runs: pass --coordinator HOST:PORT")]
    NoCoordinator,
}

fn number(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>, LaunchError> {
    match env(name) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|e| LaunchError::Bad {
            name: name.into(),
            value: v.clone(),
            why: format!("{e}"),
        }),
    }
}

fn check(rank: usize, size: usize, name: &str) -> Result<(), LaunchError> {
    if size == 0 || rank >= size {
        return Err(LaunchError::Bad {
            name: name.into(),
            value: rank.to_string(),
            why: format!("rank {rank} is not below the number of processes {size}"),
        });
    }
    Ok(())
}

/// Expands a Slurm host list (`node[01-03,07],login`) into host names.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, LaunchError> {
    let bad = |why: &str| LaunchError::Bad { name: "SLURM_NODELIST".into(), value: list.into(), why: why.into() };
    let mut hosts = Vec::new();
    let mut rest = list.trim();
    while !rest.is_empty() {
        // One item: a prefix, optionally a bracketed range list, up to the next top-level comma.
        let (item, tail) = match rest.find([',', '[']) {
            Some(i) if rest.as_bytes()[i] == b'[' => {
                let close = rest[i..].find(']').ok_or_else(|| bad("unclosed ["))? + i;
                let after = &rest[close + 1..];
                let next = after.find(',').map_or(after.len(), |c| c);
                if next != 0 {
                    return Err(bad("text after ] (only one bracket per host name is supported)"));
                }
                (&rest[..close + 1], after.strip_prefix(',').unwrap_or(after))
            }
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        match item.find('[') {
            None if item.is_empty() => return Err(bad("empty host name")),
            None => hosts.push(item.to_string()),
            Some(open) => {
                let prefix = &item[..open];
                for part in item[open + 1..item.len() - 1].split(',') {
                    let (lo, hi) = part.split_once('-').unwrap_or((part, part));
                    let width = lo.len();
                    let lo_n: u64 = lo.parse().map_err(|_| bad("range bound is not a number"))?;
                    let hi_n: u64 = hi.parse().map_err(|_| bad("range bound is not a number"))?;
                    if hi_n < lo_n || hi_n - lo_n > 100_000 {
                        return Err(bad("range is backwards or too large"));
                    }
                    for n in lo_n..=hi_n {
                        hosts.push(format!("{prefix}{n:0width$}"));
                    }
                }
            }
        }
        rest = tail;
    }
    if hosts.is_empty() {
        return Err(bad("no hosts"));
    }
    Ok(hosts)
}

/// Reads Slurm's environment (set by `srun`): `SLURM_PROCID`, `SLURM_NTASKS` (or
/// `SLURM_NPROCS`), `SLURM_STEP_NODELIST` (or `SLURM_JOB_NODELIST`, `SLURM_NODELIST`),
/// `SLURM_NNODES`, `SLURM_JOB_ID`, `SLURM_STEP_ID`. Node 0 is task 0, which Slurm places
/// on the first host of the step's list. `Ok(None)` when not under Slurm.
pub fn from_slurm(env: &dyn Fn(&str) -> Option<String>, port: u16) -> Result<Option<Placement>, LaunchError> {
    let Some(rank) = number(env, "SLURM_PROCID")? else { return Ok(None) };
    let size = match number(env, "SLURM_NTASKS")? {
        Some(n) => n,
        None => number(env, "SLURM_NPROCS")?.ok_or_else(|| LaunchError::Missing("SLURM_NTASKS".into()))?,
    };
    check(rank, size, "SLURM_PROCID")?;
    let list = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .iter()
        .find_map(|n| env(n))
        .ok_or_else(|| LaunchError::Missing("SLURM_STEP_NODELIST".into()))?;
    let hosts = expand_hostlist(&list)?;
    let nnodes = number(env, "SLURM_STEP_NUM_NODES")?.or(number(env, "SLURM_NNODES")?).unwrap_or(hosts.len());
    let job = format!(
        "slurm-{}.{}",
        env("SLURM_JOB_ID").ok_or_else(|| LaunchError::Missing("SLURM_JOB_ID".into()))?,
        env("SLURM_STEP_ID").unwrap_or_else(|| "0".into())
    );
    Ok(Some(Placement {
        rank,
        size,
        coordinator: format!("{}:{port}", hosts[0]),
        single_host: nnodes == 1,
        job,
        launcher: "slurm",
    }))
}

/// Reads an MPI launcher's environment: Open MPI's `OMPI_COMM_WORLD_RANK`,
/// `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_SIZE`, or the PMI ones of MPICH and
/// others (`PMI_RANK`, `PMI_SIZE`, `MPI_LOCALNRANKS`). MPI does not say where rank 0
/// runs: when every rank is on this host it is `127.0.0.1:port`, otherwise
/// `coordinator` must be given. `Ok(None)` when not under an MPI launcher.
pub fn from_mpi(
    env: &dyn Fn(&str) -> Option<String>,
    port: u16,
    coordinator: Option<&str>,
) -> Result<Option<Placement>, LaunchError> {
    let (rank, size, local, rank_var) = if let Some(r) = number(env, "OMPI_COMM_WORLD_RANK")? {
        let size =
            number(env, "OMPI_COMM_WORLD_SIZE")?.ok_or_else(|| LaunchError::Missing("OMPI_COMM_WORLD_SIZE".into()))?;
        (r, size, number(env, "OMPI_COMM_WORLD_LOCAL_SIZE")?, "OMPI_COMM_WORLD_RANK")
    } else if let Some(r) = number(env, "PMI_RANK")? {
        let size = number(env, "PMI_SIZE")?.ok_or_else(|| LaunchError::Missing("PMI_SIZE".into()))?;
        (r, size, number(env, "MPI_LOCALNRANKS")?, "PMI_RANK")
    } else {
        return Ok(None);
    };
    check(rank, size, rank_var)?;
    let single_host = local == Some(size);
    let coordinator = match coordinator {
        Some(c) => c.to_string(),
        None if single_host => format!("127.0.0.1:{port}"),
        None => return Err(LaunchError::NoCoordinator),
    };
    // A name every rank of this run shares: the launcher's job id where it gives one.
    let job = ["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID", "PMI_KVSNAME"]
        .iter()
        .find_map(|n| env(n))
        .map(|j| j.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect::<String>())
        .unwrap_or_else(|| format!("port{port}"));
    Ok(Some(Placement { rank, size, coordinator, single_host, job: format!("mpi-{job}"), launcher: "mpirun" }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn hostlists_expand() {
        assert_eq!(expand_hostlist("a").unwrap(), ["a"]);
        assert_eq!(expand_hostlist("n[1-3]").unwrap(), ["n1", "n2", "n3"]);
        assert_eq!(expand_hostlist("n[008-010],x[1,3],y").unwrap(), ["n008", "n009", "n010", "x1", "x3", "y"]);
        assert!(expand_hostlist("n[1-").is_err());
        assert!(expand_hostlist("n[3-1]").is_err());
        assert!(expand_hostlist("").is_err());
    }

    #[test]
    fn slurm_placement() {
        let env = env_of(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "node[3-4]"),
            ("SLURM_NNODES", "2"),
            ("SLURM_JOB_ID", "77"),
        ]);
        let p = from_slurm(&env, 9000).unwrap().unwrap();
        assert_eq!(
            p,
            Placement {
                rank: 0,
                size: 2,
                coordinator: "node3:9000".into(),
                single_host: false,
                job: "slurm-77.0".into(),
                launcher: "slurm"
            }
        );
        assert_eq!(from_slurm(&env_of(&[]), 1).unwrap(), None);
        let bad =
            env_of(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "2"), ("SLURM_NODELIST", "a"), ("SLURM_JOB_ID", "1")]);
        assert!(from_slurm(&bad, 1).is_err());
        let one = env_of(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NPROCS", "2"),
            ("SLURM_NODELIST", "h"),
            ("SLURM_NNODES", "1"),
            ("SLURM_JOB_ID", "5"),
            ("SLURM_STEP_ID", "3"),
        ]);
        let p = from_slurm(&one, 1).unwrap().unwrap();
        assert!(p.single_host);
        assert_eq!(p.job, "slurm-5.3");
    }

    #[test]
    fn mpi_placement() {
        let ompi = env_of(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_MCA_ess_base_jobid", "123@1"),
        ]);
        let p = from_mpi(&ompi, 7000, None).unwrap().unwrap();
        assert_eq!((p.rank, p.size, p.single_host), (3, 4, true));
        assert_eq!(p.coordinator, "127.0.0.1:7000");
        assert_eq!(p.job, "mpi-123-1");
        let pmi = env_of(&[("PMI_RANK", "1"), ("PMI_SIZE", "8")]);
        assert_eq!(from_mpi(&pmi, 7000, None), Err(LaunchError::NoCoordinator));
        let p = from_mpi(&pmi, 7000, Some("head:7000")).unwrap().unwrap();
        assert_eq!((p.rank, p.size, p.single_host, p.coordinator.as_str()), (1, 8, false, "head:7000"));
        assert_eq!(from_mpi(&env_of(&[]), 1, None).unwrap(), None);
        assert!(from_mpi(&env_of(&[("PMI_RANK", "x"), ("PMI_SIZE", "2")]), 1, None).is_err());
    }
}
