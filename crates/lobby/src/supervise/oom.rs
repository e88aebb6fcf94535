//! Whether a lost worker was killed by the kernel's OOM killer (docs/SIGNALS.md, "How a killed
//! worker is named"). The kernel counts each OOM kill in the victim's memory cgroup (cgroup v2
//! `memory.events` `oom_kill`, v1 `memory.oom_control` `oom_kill`) before the victim dies, so
//! by the time the lobby hears of a loss the count has moved; each move not yet accounted for
//! is taken to be the kill of the first worker lost after it. The lobby's own cgroup is read,
//! which its workers share unless something outside moved them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// A v1 `memory.limit_in_bytes` this large is no limit: the kernel shows "none" as 2^63 less a
/// page.
const V1_NO_LIMIT: u64 = 1 << 62;

/// An OOM kill the memory cgroup counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct OomKill {
    /// What counted it: the cgroup's counter file and its count, for the log.
    pub counted: String,
    /// The lowest memory limit of the cgroup and those above it, in bytes; None when none is set.
    pub limit: Option<u64>,
}

/// A memory cgroup: its directory, and which version of the interface it has.
#[derive(Clone, Debug, PartialEq, Eq)]
struct MemoryCgroup {
    dir: PathBuf,
    /// Where its hierarchy starts: the limits above it are looked for up to here.
    top: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// The memory cgroup `proc_cgroup` (the text of /proc/PID/cgroup) names under `root`: a v1
    /// `memory` hierarchy where there is one, else the v2 unified one, if it has the memory
    /// controller (its `memory.events`).
    fn of(proc_cgroup: &str, root: &Path) -> Option<MemoryCgroup> {
        let mut unified = None;
        for line in proc_cgroup.lines() {
            let mut fields = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
                continue;
            };
            let relative = path.trim_start_matches('/');
            if controllers.split(',').any(|controller| controller == "memory") {
                let top = root.join("memory");
                let cgroup = MemoryCgroup { dir: top.join(relative), top, v2: false };
                if cgroup.counter_file().exists() {
                    return Some(cgroup);
                }
            } else if controllers.is_empty() {
                unified = Some(MemoryCgroup { dir: root.join(relative), top: root.to_path_buf(), v2: true });
            }
        }
        unified.filter(|cgroup| cgroup.counter_file().exists())
    }

    fn counter_file(&self) -> PathBuf {
        self.dir.join(if self.v2 { "memory.events" } else { "memory.oom_control" })
    }

    /// The OOM kills it has counted; None when the kernel keeps no such count (before 4.13).
    fn oom_kills(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.counter_file()).ok()?;
        text.lines().find_map(|line| line.strip_prefix("oom_kill ")).and_then(|count| count.trim().parse().ok())
    }

    /// The lowest limit on the way up to the hierarchy's top.
    fn limit(&self) -> Option<u64> {
        let file = if self.v2 { "memory.max" } else { "memory.limit_in_bytes" };
        let mut lowest: Option<u64> = None;
        let mut dir = Some(self.dir.as_path());
        while let Some(here) = dir.filter(|here| here.starts_with(&self.top)) {
            // v2 writes "max" for none, and has no file at its root.
            let limit = std::fs::read_to_string(here.join(file)).ok().and_then(|text| text.trim().parse::<u64>().ok());
            if let Some(limit) = limit.filter(|limit| self.v2 || *limit < V1_NO_LIMIT) {
                lowest = Some(lowest.map_or(limit, |lowest| lowest.min(limit)));
            }
            dir = here.parent();
        }
        lowest
    }

    fn describe(&self, count: u64) -> String {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        format!("memory cgroup {} ({file} oom_kill {count})", self.dir.display())
    }
}

/// What the lobby knows of the OOM kills its memory cgroup counted.
pub(super) struct OomWatch {
    root: PathBuf,
    /// /proc/self/cgroup: which cgroup the lobby is in, read at each look.
    proc_cgroup: PathBuf,
    /// The cgroup last read, and how many of its OOM kills are accounted for: those before the
    /// lobby started, and each one since given to a lost worker.
    seen: Option<(MemoryCgroup, u64)>,
    /// Workers judged at the first of the two events that tell of a loss (its channel's end,
    /// the zygote's report of its exit status), by pid, until the other.
    verdicts: HashMap<i32, Option<OomKill>>,
}

/// What the memory cgroup says of a worker's SIGKILL.
pub(super) enum Verdict {
    /// It counted an OOM kill for it.
    Certain(OomKill),
    /// It counted none; why it cannot tell, or what it counted.
    Unknown(String),
}

impl Verdict {
    pub(super) fn certain(self) -> Option<OomKill> {
        match self {
            Verdict::Certain(kill) => Some(kill),
            Verdict::Unknown(_) => None,
        }
    }
}

impl OomWatch {
    /// Starts counting from what the lobby's memory cgroup has counted so far.
    pub(super) fn new() -> OomWatch {
        OomWatch::under(Path::new(CGROUP_ROOT), Path::new("/proc/self/cgroup"))
    }

    fn under(root: &Path, proc_cgroup: &Path) -> OomWatch {
        let mut watch = OomWatch {
            root: root.to_path_buf(),
            proc_cgroup: proc_cgroup.to_path_buf(),
            seen: None,
            verdicts: HashMap::new(),
        };
        watch.seen = watch.read().and_then(|(cgroup, count)| Some((cgroup, count?)));
        watch
    }

    fn read(&self) -> Option<(MemoryCgroup, Option<u64>)> {
        let proc_cgroup = std::fs::read_to_string(&self.proc_cgroup).ok()?;
        let cgroup = MemoryCgroup::of(&proc_cgroup, &self.root)?;
        let count = cgroup.oom_kills();
        Some((cgroup, count))
    }

    /// An OOM kill counted since the last look and not yet given to a worker: the next one.
    fn next_kill(&mut self) -> Result<OomKill, String> {
        let Some((cgroup, count)) = self.read() else {
            return Err(format!("no memory cgroup under {} in /proc/self/cgroup", self.root.display()));
        };
        let Some(count) = count else {
            return Err(format!("{} counts no OOM kills", cgroup.counter_file().display()));
        };
        let accounted = match &self.seen {
            Some((seen, accounted)) if *seen == cgroup => *accounted,
            // Moved to another cgroup since: what it counted before is no news.
            _ => count,
        };
        if count > accounted {
            self.seen = Some((cgroup.clone(), accounted + 1));
            Ok(OomKill { counted: cgroup.describe(accounted + 1), limit: cgroup.limit() })
        } else {
            let limit = cgroup.limit().map_or(String::new(), |limit| format!("; its limit is {}", mib(limit)));
            let described = cgroup.describe(count);
            self.seen = Some((cgroup, count));
            Err(format!("{described} counted no new one{limit}"))
        }
    }

    /// The verdict on lost worker `pid`: looked for in the cgroup at the first of its two
    /// events, when `look` (a loss maitred did not cause), and kept for the other while
    /// `other_to_come`.
    pub(super) fn judge(&mut self, pid: i32, look: bool, other_to_come: bool) -> Verdict {
        if let Some(kept) = self.verdicts.remove(&pid) {
            // A look now could only find another worker's kill.
            return kept.map_or_else(|| Verdict::Unknown(self.read_again()), Verdict::Certain);
        }
        // Not looked for: nothing to say, as the other event, if it names a SIGKILL, reads anew.
        let verdict = if look { self.next_kill() } else { Err(String::new()) };
        if other_to_come {
            self.verdicts.insert(pid, verdict.as_ref().ok().cloned());
        }
        verdict.map_or_else(Verdict::Unknown, Verdict::Certain)
    }

    /// What the cgroup counts now, for a worker already judged not an OOM kill.
    fn read_again(&self) -> String {
        match self.read() {
            Some((cgroup, Some(count))) => format!("{} counted none for it", cgroup.describe(count)),
            Some((cgroup, None)) => format!("{} counts no OOM kills", cgroup.counter_file().display()),
            None => format!("no memory cgroup under {} in /proc/self/cgroup", self.root.display()),
        }
    }
}

/// `128.0 MiB`
pub(super) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup tree of real files under a fresh temporary directory.
    fn tree(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("maitred-oom-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        root
    }

    #[test]
    fn finds_the_v1_memory_hierarchy_before_the_unified_one() {
        let root = tree("v1");
        let leaf = root.join("memory/outer/inner");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(leaf.join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
        std::fs::write(leaf.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(leaf.parent().unwrap().join("memory.limit_in_bytes"), "134217728\n").unwrap();
        let cgroup = MemoryCgroup::of("4:memory:/outer/inner\n0::/\n", &root).unwrap();
        assert_eq!(cgroup, MemoryCgroup { dir: leaf, top: root.join("memory"), v2: false });
        assert_eq!(cgroup.oom_kills(), Some(3));
        assert_eq!(cgroup.limit(), Some(128 << 20));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn reads_the_unified_hierarchy() {
        let root = tree("v2");
        let leaf = root.join("app.slice/maitred.service");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(leaf.join("memory.events"), "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n")
            .unwrap();
        std::fs::write(leaf.join("memory.max"), "max\n").unwrap();
        std::fs::write(root.join("app.slice/memory.max"), "268435456\n").unwrap();
        let cgroup = MemoryCgroup::of("0::/app.slice/maitred.service\n", &root).unwrap();
        assert!(cgroup.v2);
        assert_eq!(cgroup.oom_kills(), Some(1));
        assert_eq!(cgroup.limit(), Some(256 << 20));
        // No memory controller: no cgroup to read.
        assert_eq!(MemoryCgroup::of("0::/elsewhere\n", &root), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn gives_each_counted_kill_to_one_lost_worker() {
        let root = tree("judge");
        let leaf = root.join("memory/maitred");
        std::fs::create_dir_all(&leaf).unwrap();
        let count =
            |kills: u32| std::fs::write(leaf.join("memory.oom_control"), format!("oom_kill {kills}\n")).unwrap();
        count(2);
        std::fs::write(leaf.join("memory.limit_in_bytes"), "67108864\n").unwrap();
        std::fs::write(root.join("cgroup"), "7:memory:/maitred\n").unwrap();
        let mut watch = OomWatch::under(&root, &root.join("cgroup"));
        // Kills counted before the lobby started are no worker's.
        assert!(matches!(watch.judge(10, true, true), Verdict::Unknown(why) if why.contains("counted no new one")));
        count(3);
        // The first event of worker 10 found none: its second does not take worker 11's kill.
        assert!(matches!(watch.judge(10, true, false), Verdict::Unknown(_)));
        let Verdict::Certain(kill) = watch.judge(11, true, true) else { panic!("worker 11 was OOM killed") };
        assert_eq!(kill.limit, Some(64 << 20));
        assert!(kill.counted.ends_with("maitred (memory.oom_control oom_kill 3)"), "{}", kill.counted);
        // Its other event hears the same; a third loss finds the kill taken.
        assert_eq!(watch.judge(11, false, false).certain(), Some(kill));
        assert!(matches!(watch.judge(12, true, false), Verdict::Unknown(_)));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
