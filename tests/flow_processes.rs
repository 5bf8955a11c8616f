//! Flows across worker processes: five child processes (this binary run again with the
//! `flows_child` filter) serve the two queues of 200 flows of 10 jobs each, on one backend:
//!
//! ```text
//! a -> (b, c, d) -> e -> (f, g, h) -> i -> j      (a, c, e, g, i on one queue; the rest on the other)
//! ```
//!
//! Every handler appends a line to its process's ledger when it ends (after its work):
//! `<flow id> <job id> <pid> <start µs> <end µs>` (a run killed before its end writes nothing),
//! and a start mark when it starts. It checks that its node is not done already (read with
//! `Flows::flow`) and, before it ends, what its [`FlowInfo`] says (no parent failed; its
//! parents, and those that succeeded, are the ones it was added after; its parents' results,
//! read with `parent_results`, are each parent's value); it writes any problem to a third file,
//! and returns a small JSON value, its result.
//!
//! The parent publishes the flows (`Flows::publish_flow`) once the children are up, kills one
//! child with SIGKILL once 30% of the jobs have ended (while it runs a handler) and starts a
//! replacement, waits until every node of every flow is done and the queues are empty, stops
//! the children and reads the ledgers back:
//!
//! - no handler saw a problem;
//! - every job ran to its end once: no (flow, job) has two ended runs, except a job whose first
//!   run ended in the killed process less than two leases before the kill and whose second
//!   started after it in another process (killed between its handler's end and its node marked
//!   done: it legitimately runs again; 2 to 7 jobs do in each run, killed 20 to 500 ms after
//!   their handler ended, the time the result and the flow's record take to write under load);
//! - every job started after each of its parents ended (wall clock in µs, one machine);
//! - every process (the five, and the replacement) ran jobs; every job the killed process was
//!   running when killed ended in another process;
//! - each flow's last job's result is kept.
//!
//! On SQLite (a file the processes share), Postgres, Redis and a Redis Cluster. A missing
//! server URL fails the test. On SQL the jobs go in the conformance table, whose text id
//! stores a job published twice (a node released by two processes at once) once; on a table
//! whose id the database generates (the `jobs` table of `examples/hold_expiry.rs`) such a job
//! was stored twice and its second copy ran while the first finished: flows are now refused on
//! such tables (`tests/sql_flows.rs`).

mod common;
#[allow(dead_code)]
mod common_redis;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ConfRow, Db as _, Lite, Pg};
use stagedoor_jobs::flow::{FlowView, NodeState};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{BoxError, Broker, BrokerError, RouteBuilder};
use stagedoor_jobs_redis::RedisBroker;

/// The two queues; node `k` of a flow goes on `QUEUES[k % 2]`.
const QUEUES: [&str; 2] = ["flow_even", "flow_odd"];
/// Each flow's nodes, in the order they are added, with their parents.
const SHAPE: [(&str, &[&str]); 10] = [
    ("a", &[]),
    ("b", &["a"]),
    ("c", &["a"]),
    ("d", &["a"]),
    ("e", &["b", "c", "d"]),
    ("f", &["e"]),
    ("g", &["e"]),
    ("h", &["e"]),
    ("i", &["f", "g", "h"]),
    ("j", &["i"]),
];
const FLOWS: usize = 200;
const PROCESSES: usize = 5;
/// Handlers each process runs at once, per queue.
const SLOTS: usize = 4;
/// How long each handler works.
const HOLD: Duration = Duration::from_millis(20);
/// The brokers' lease: the killed child's jobs come back after it.
const LEASE: Duration = Duration::from_secs(3);
/// How long results and finished flows are kept.
const KEEP: Duration = Duration::from_secs(600);
/// The longest the parent waits for the flows to finish.
const PATIENCE: Duration = Duration::from_secs(180);

const ENV_CHILD: &str = "STAGEDOOR_FLOWS_CHILD";
const ENV_DIR: &str = "STAGEDOOR_FLOWS_DIR";
const ENV_NAMESPACE: &str = "STAGEDOOR_FLOWS_NAMESPACE";

/// One run at a time: five busy processes are plenty for two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}

// ---------------------------------------------------------------------------------------------
// The ledger
// ---------------------------------------------------------------------------------------------

/// A child's three files in the run's directory: `<pid>.runs` (ended runs), `<pid>.starts`
/// (`<flow> <job> <pid> <start µs>`) and `<pid>.problems`. Each line is one write(2) on a file
/// opened for appending.
struct Ledger {
    runs: std::fs::File,
    starts: std::fs::File,
    problems: std::fs::File,
}

impl Ledger {
    fn open(dir: &Path) -> Self {
        let pid = std::process::id();
        let open = |ext: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(format!("{pid}.{ext}")))
                .expect("open a ledger file")
        };
        Self {
            runs: open("runs"),
            starts: open("starts"),
            problems: open("problems"),
        }
    }

    fn line(mut file: &std::fs::File, line: String) {
        file.write_all(line.as_bytes())
            .expect("append to the ledger");
        file.flush().expect("flush the ledger");
    }

    fn started(&self, flow: &str, job: &str, start: u128) {
        let pid = std::process::id();
        Self::line(&self.starts, format!("{flow} {job} {pid} {start}\n"));
    }

    fn ended(&self, flow: &str, job: &str, start: u128, end: u128) {
        let pid = std::process::id();
        Self::line(&self.runs, format!("{flow} {job} {pid} {start} {end}\n"));
    }

    fn problem(&self, flow: &str, job: &str, what: &str) {
        let what = what.replace('\n', " ");
        Self::line(&self.problems, format!("{flow} {job}: {what}\n"));
    }
}

/// One line of a `.runs` or `.starts` file (`end` is `None` for a start mark).
#[derive(Clone, Debug)]
struct Run {
    flow: String,
    job: String,
    pid: u32,
    start: u128,
    end: Option<u128>,
}

/// Every whole line (ending in a newline) of the run directory's files ending in `.ext`.
fn lines(dir: &Path, ext: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read the run's directory") {
        let path = entry.expect("a directory entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some(ext) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        // A line being written as it is read has no newline yet: left for the next read.
        let whole = text.rfind('\n').map_or("", |i| &text[..i]);
        out.extend(whole.lines().filter(|l| !l.is_empty()).map(str::to_owned));
    }
    out
}

fn unreadable(line: &str) -> ! {
    panic!("a ledger line that does not read: `{line}`")
}

fn read_runs(dir: &Path, ext: &str) -> Vec<Run> {
    lines(dir, ext)
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let num = |s: &str| s.parse::<u128>().unwrap_or_else(|_| unreadable(l));
            if !(4..=5).contains(&f.len()) {
                unreadable(l);
            }
            Run {
                flow: f[0].to_owned(),
                job: f[1].to_owned(),
                pid: f[2].parse().unwrap_or_else(|_| unreadable(l)),
                start: num(f[3]),
                end: f.get(4).map(|e| num(e)),
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The handler
// ---------------------------------------------------------------------------------------------

/// A flow job's payload: its node's name and its parents' job ids.
#[derive(serde::Serialize, serde::Deserialize)]
struct Step {
    node: String,
    parents: Vec<String>,
}

type ReadFlow = Pin<Box<dyn Future<Output = Result<Option<FlowView>, BrokerError>> + Send>>;

/// Reads a flow as it stands (`Flows::flow`) with a broker of the child's own: the handler
/// looks at its own node.
struct FlowReader(Box<dyn Fn(String) -> ReadFlow + Send + Sync>);

impl FlowReader {
    fn of<B: Broker>(broker: B) -> Self {
        Self(Box::new(move |id| {
            let b = broker.clone();
            Box::pin(async move { b.flow(&id).await })
        }))
    }

    /// What is wrong with node `job`'s state while its handler runs: it is published (ready
    /// until its publisher marks it released), never done already.
    async fn check(&self, flow: &str, job: &str) -> Option<String> {
        let view = match (self.0)(flow.to_owned()).await {
            Ok(Some(v)) => v,
            Ok(None) => return Some("its flow is gone while it runs".to_owned()),
            Err(e) => return Some(format!("its flow does not read: {e}")),
        };
        match view.nodes.iter().find(|n| n.id == job).map(|n| n.state) {
            Some(NodeState::Released | NodeState::Ready) => None,
            other => Some(format!("its node is {other:?} while its handler runs")),
        }
    }
}

/// Logs its start, looks at its node, works, checks its flow, logs its end and returns its
/// value.
async fn step(
    msg: &Step,
    flow: FlowInfo,
    Ctx(id): Ctx<keys::JobId>,
    Data(ledger): Data<Arc<Ledger>>,
    Data(reader): Data<Arc<FlowReader>>,
) -> Result<serde_json::Value, BoxError> {
    let start = micros();
    let id = id.as_str();
    ledger.started(flow.flow_id(), id, start);
    if let Some(p) = reader.check(flow.flow_id(), id).await {
        ledger.problem(flow.flow_id(), id, &p);
    }
    tokio::time::sleep(HOLD).await;
    for p in check(msg, &flow).await {
        ledger.problem(flow.flow_id(), id, &p);
    }
    ledger.ended(flow.flow_id(), id, start, micros());
    Ok(serde_json::json!({
        "flow": flow.flow_id(),
        "job": id,
        "node": msg.node,
        "pid": std::process::id(),
    }))
}

/// What is wrong with what the job's [`FlowInfo`] says.
async fn check(msg: &Step, flow: &FlowInfo) -> Vec<String> {
    let mut bad = Vec::new();
    if !flow.is_in_flow() {
        return vec!["the job's FlowInfo says it is in no flow".to_owned()];
    }
    if !flow.failed().is_empty() {
        bad.push(format!("failed parents: {:?}", flow.failed()));
    }
    let want: BTreeSet<&str> = msg.parents.iter().map(String::as_str).collect();
    let parents: BTreeSet<&str> = flow.parents().iter().map(String::as_str).collect();
    if parents != want || flow.parents().len() != want.len() {
        bad.push(format!(
            "parents {:?}, added after {want:?}",
            flow.parents()
        ));
    }
    let ok: BTreeSet<&str> = flow.succeeded().iter().map(String::as_str).collect();
    if ok != want || flow.succeeded().len() != want.len() {
        bad.push(format!(
            "succeeded {:?}, parents {want:?}",
            flow.succeeded()
        ));
    }
    if want.is_empty() {
        return bad;
    }
    let results = match flow.parent_results().await {
        Ok(r) => r,
        Err(e) => {
            bad.push(format!("parent_results: {e}"));
            return bad;
        }
    };
    let got: BTreeSet<&str> = results.keys().map(String::as_str).collect();
    if got != want {
        bad.push(format!("parent_results of {got:?}, parents {want:?}"));
    }
    for (parent, r) in &results {
        match r.get::<serde_json::Value>() {
            Ok(v) if v["job"] == parent.as_str() && v["flow"] == flow.flow_id() => {}
            Ok(v) => bad.push(format!("parent {parent}'s result is {v}")),
            Err(e) => bad.push(format!("parent {parent}'s result does not read: {e}")),
        }
    }
    bad
}

fn mount<B: Broker>(b: &mut RouteBuilder<B>) {
    for q in QUEUES {
        b.include(Subscriber::new(q, step).name(q))
            .concurrency(SLOTS)
            .keep_results(KEEP);
    }
}

// ---------------------------------------------------------------------------------------------
// The backends
// ---------------------------------------------------------------------------------------------

enum Backend {
    Sqlite(Lite),
    Postgres(Pg),
    Redis(String),
    Cluster(String),
}

impl Backend {
    /// A fresh database, schema or namespace. The jobs go in the conformance table, whose text
    /// id keeps a job published twice (two processes releasing a node at once) stored once.
    async fn fresh(kind: &str) -> Self {
        let ns = || common_redis::fresh_namespace("flows-");
        match kind {
            "sqlite" => Backend::Sqlite(Lite::fresh("flows", common::SQLITE_CONF_SCHEMA).await),
            "postgres" => Backend::Postgres(Pg::fresh("flows", common::PG_CONF_SCHEMA).await),
            "redis" => Backend::Redis(ns()),
            "cluster" => Backend::Cluster(ns()),
            other => panic!("unknown backend {other}"),
        }
    }

    async fn from_env(kind: &str) -> Self {
        let ns = || std::env::var(ENV_NAMESPACE).expect("the child's namespace");
        match kind {
            "sqlite" => Backend::Sqlite(Lite::from_env().await.expect("the child's SQLite file")),
            "postgres" => Backend::Postgres(Pg::from_env().await.expect("the child's schema")),
            "redis" => Backend::Redis(ns()),
            "cluster" => Backend::Cluster(ns()),
            other => panic!("unknown backend {other}"),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
            Backend::Redis(_) => "redis",
            Backend::Cluster(_) => "cluster",
        }
    }

    fn child_env(&self) -> Vec<(String, String)> {
        let mut env = vec![(ENV_CHILD.to_owned(), self.kind().to_owned())];
        let db = match self {
            Backend::Sqlite(db) => db.child_env(),
            Backend::Postgres(db) => db.child_env(),
            Backend::Redis(ns) | Backend::Cluster(ns) => {
                vec![(ENV_NAMESPACE, ns.clone())]
            }
        };
        env.extend(db.into_iter().map(|(k, v)| (k.to_owned(), v)));
        env
    }

    fn redis(ns: &str) -> RedisBroker {
        RedisBroker::from_url(common_redis::env_url("REDIS_URL"))
            .namespace(ns)
            .lease(LEASE)
    }

    fn cluster(ns: &str) -> RedisBroker {
        RedisBroker::cluster(common_redis::cluster_urls())
            .namespace(ns)
            .lease(LEASE)
    }

    /// A connected reader of this backend's flows.
    async fn reader(&self) -> FlowReader {
        async fn connected<B: Broker>(b: B) -> FlowReader {
            b.connect().await.expect("connect the child's reader");
            FlowReader::of(b)
        }
        match self {
            Backend::Sqlite(db) => connected(db.broker().route::<ConfRow>(QUEUES[0])).await,
            Backend::Postgres(db) => connected(db.broker().route::<ConfRow>(QUEUES[0])).await,
            Backend::Redis(ns) => connected(Self::redis(ns)).await,
            Backend::Cluster(ns) => connected(Self::cluster(ns)).await,
        }
    }

    /// A service serving both queues on this backend.
    fn service(&self, service: Service) -> Service {
        match self {
            Backend::Sqlite(db) => {
                service.with_broker(db.broker().lease(LEASE).route::<ConfRow>(QUEUES[0]), mount)
            }
            Backend::Postgres(db) => {
                service.with_broker(db.broker().lease(LEASE).route::<ConfRow>(QUEUES[0]), mount)
            }
            Backend::Redis(ns) => service.with_broker(Self::redis(ns), mount),
            Backend::Cluster(ns) => service.with_broker(Self::cluster(ns), mount),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The child workers
// ---------------------------------------------------------------------------------------------

/// A child worker: serves both queues until its parent writes the `stop` file. A no-op unless
/// a parent set [`ENV_CHILD`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flows_child() {
    let Ok(kind) = std::env::var(ENV_CHILD) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(ENV_DIR).expect("the run's directory"));
    let backend = Backend::from_env(&kind).await;
    let pid = std::process::id();
    let service = Service::new(AppInfo::new(format!("flows-child-{pid}"), "0.1.0"))
        .state(Arc::new(Ledger::open(&dir)))
        .state(Arc::new(backend.reader().await));
    let running = backend
        .service(service)
        .start()
        .await
        .unwrap_or_else(|e| panic!("the child worker starts: {e}"));
    let mut ready = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("ready"))
        .expect("the ready file");
    // One write of the whole line: processes append at once, and `writeln!` may write the pid
    // and its newline apart, interleaving two lines (seen in CI: `2119921196`).
    ready
        .write_all(format!("{pid}\n").as_bytes())
        .expect("write the ready file");
    let until = Instant::now() + PATIENCE * 2;
    while !dir.join("stop").exists() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown().await;
}

/// A child worker process; killed when dropped.
struct ChildWorker {
    child: Child,
    stderr: PathBuf,
}

impl ChildWorker {
    fn spawn(backend: &Backend, dir: &Path, n: usize) -> Self {
        let exe = std::env::current_exe().expect("the test binary");
        let stderr = dir.join(format!("child-{n}.stderr"));
        let child = Command::new(exe)
            .args(["flows_child", "--exact", "--nocapture", "--test-threads=1"])
            .envs(backend.child_env())
            .env(ENV_DIR, dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("the child's stderr file"))
            .spawn()
            .expect("spawn a child worker");
        Self { child, stderr }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics with the child's stderr if it has exited (a worker that failed).
    fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            panic!("a child worker exited ({status}):\n{err}");
        }
    }

    /// SIGKILL, and waits for the process to be gone.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until `pids` all wrote the ready file.
async fn wait_ready(dir: &Path, children: &mut [ChildWorker]) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let ready = std::fs::read_to_string(dir.join("ready")).unwrap_or_default();
        let ready: BTreeSet<u32> = ready.lines().filter_map(|l| l.parse().ok()).collect();
        if children.iter().all(|c| ready.contains(&c.pid())) {
            return;
        }
        for c in children.iter_mut() {
            c.check_alive();
        }
        assert!(
            Instant::now() < deadline,
            "the child workers did not all start within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The parent
// ---------------------------------------------------------------------------------------------

/// A job of the plan: its flow, its node's name, its parents' job ids.
struct Planned {
    flow: String,
    node: &'static str,
    parents: Vec<String>,
}

/// 200 flows of [`SHAPE`]; the jobs planned, by job id.
fn build_flows() -> (Vec<Flow>, BTreeMap<String, Planned>) {
    let mut flows = Vec::new();
    let mut plan = BTreeMap::new();
    for _ in 0..FLOWS {
        let mut flow = Flow::new().keep(KEEP);
        let mut ids: BTreeMap<&str, JobId> = BTreeMap::new();
        for (k, (node, parents)) in SHAPE.iter().enumerate() {
            let parent_ids: Vec<JobId> = parents.iter().map(|p| ids[p].clone()).collect();
            let parents: Vec<String> = parent_ids.iter().map(|p| p.as_str().to_owned()).collect();
            let step = Step {
                node: (*node).to_owned(),
                parents: parents.clone(),
            };
            let job = Job::new(QUEUES[k % 2], &step).expect("encode");
            let id = if parent_ids.is_empty() {
                flow.add(job)
            } else {
                flow.add_after(job, &parent_ids)
                    .expect("the parents are in the flow")
            };
            plan.insert(
                id.as_str().to_owned(),
                Planned {
                    flow: flow.id().to_owned(),
                    node,
                    parents,
                },
            );
            ids.insert(node, id);
        }
        flows.push(flow);
    }
    (flows, plan)
}

/// The child killed mid-run.
struct Kill {
    pid: u32,
    /// After the process was gone.
    at: u128,
    /// The jobs it was running.
    running: BTreeSet<(String, String)>,
}

async fn run(kind: &str) {
    let _one = SERIAL.lock().await;
    let backend = Backend::fresh(kind).await;
    match &backend {
        Backend::Sqlite(db) => {
            let b = db.broker().lease(LEASE).route::<ConfRow>(QUEUES[0]);
            drive(&backend, b).await;
        }
        Backend::Postgres(db) => {
            let b = db.broker().lease(LEASE).route::<ConfRow>(QUEUES[0]);
            drive(&backend, b).await;
        }
        Backend::Redis(ns) => drive(&backend, Backend::redis(ns)).await,
        Backend::Cluster(ns) => drive(&backend, Backend::cluster(ns)).await,
    }
}

/// Publishes the flows with `broker`, runs them on five children (one killed and replaced),
/// and checks the ledger.
async fn drive<B: Broker>(backend: &Backend, broker: B) {
    let kind = backend.kind();
    let began = Instant::now();
    broker.connect().await.expect("connect the parent's broker");
    let dir = std::env::temp_dir().join(format!("stagedoor-flows-{}", common::unique()));
    std::fs::create_dir_all(&dir).expect("the run's directory");
    let (flows, plan) = build_flows();
    let flow_ids: Vec<String> = flows.iter().map(|f| f.id().to_owned()).collect();
    let total = plan.len();

    let mut children: Vec<ChildWorker> = (0..PROCESSES)
        .map(|n| ChildWorker::spawn(backend, &dir, n))
        .collect();
    wait_ready(&dir, &mut children).await;
    let started = Instant::now();
    for flow in flows {
        let id = flow.id().to_owned();
        let stored = broker.publish_flow(flow).await.expect("publish a flow");
        assert_eq!(stored, id);
    }
    let published = started.elapsed();

    let kill = run_to_the_end(kind, &dir, &mut children, backend, total).await;
    let ran = started.elapsed();
    all_done(kind, &broker, &flow_ids).await;
    let settled = started.elapsed();
    stop(&dir, &mut children).await;

    let runs = read_runs(&dir, "runs");
    let starts = read_runs(&dir, "starts");
    let problems = lines(&dir, "problems");
    let pids: Vec<u32> = children.iter().map(ChildWorker::pid).collect();
    drop(children);
    assert!(
        problems.is_empty(),
        "{kind}: handlers found {} problems with their FlowInfo, first: {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    let tolerated = check_runs(kind, &plan, &runs, &kill);
    check_order(kind, &plan, &runs);
    check_processes(kind, &runs, &starts, &kill, &pids);
    check_results(kind, &broker, &plan).await;
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{kind}: {FLOWS} flows of {} jobs ({total} jobs) on {PROCESSES} processes: published in {published:.2?}, \
         every job ended {ran:.2?} after the first publish, every flow done and the queues empty after {settled:.2?}; \
         {} runs ended, {tolerated} job(s) ran again after the kill of {} ({} running when killed); whole test {:.2?}",
        SHAPE.len(),
        runs.len(),
        kill.pid,
        kill.running.len(),
        began.elapsed()
    );
}

/// Polls the ledger until every job ended once; kills a child at 30% and starts a replacement.
async fn run_to_the_end(
    kind: &str,
    dir: &Path,
    children: &mut Vec<ChildWorker>,
    backend: &Backend,
    total: usize,
) -> Kill {
    let deadline = Instant::now() + PATIENCE;
    let mut kill = None;
    loop {
        let ended: BTreeSet<(String, String)> = read_runs(dir, "runs")
            .into_iter()
            .map(|r| (r.flow, r.job))
            .collect();
        if kill.is_none() && ended.len() * 10 >= total * 3 {
            kill = Some(kill_one(dir, &mut children[0]).await);
            children.push(ChildWorker::spawn(backend, dir, PROCESSES));
            let last = children.len() - 1;
            wait_ready(dir, &mut children[last..]).await;
        }
        if ended.len() >= total {
            return kill.expect("a child was killed at 30%");
        }
        for (i, c) in children.iter_mut().enumerate() {
            if i > 0 || kill.is_none() {
                c.check_alive();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{kind}: only {} of {total} jobs ended after {PATIENCE:?}",
            ended.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kills `victim` with SIGKILL while it runs a handler (waiting up to 5 s for one).
async fn kill_one(dir: &Path, victim: &mut ChildWorker) -> Kill {
    let pid = victim.pid();
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let running = running_in(dir, pid);
        if !running.is_empty() || Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    victim.kill();
    let at = micros();
    Kill {
        pid,
        at,
        running: running_in(dir, pid),
    }
}

/// The jobs process `pid` started and has not ended.
fn running_in(dir: &Path, pid: u32) -> BTreeSet<(String, String)> {
    let key = |r: &Run| (r.flow.clone(), r.job.clone(), r.start);
    let ended: BTreeSet<_> = read_runs(dir, "runs")
        .iter()
        .filter(|r| r.pid == pid)
        .map(key)
        .collect();
    read_runs(dir, "starts")
        .iter()
        .filter(|r| r.pid == pid && !ended.contains(&key(r)))
        .map(|r| (r.flow.clone(), r.job.clone()))
        .collect()
}

/// Waits until every node of every flow is done, and both queues are empty with no dead letter.
async fn all_done<B: Broker>(kind: &str, broker: &B, flow_ids: &[String]) {
    let deadline = Instant::now() + PATIENCE;
    let mut left: Vec<&String> = flow_ids.iter().collect();
    while !left.is_empty() {
        let mut still = Vec::new();
        for id in left {
            let view = broker
                .flow(id)
                .await
                .expect("read a flow")
                .unwrap_or_else(|| panic!("{kind}: flow {id} is gone"));
            assert_eq!(view.nodes.len(), SHAPE.len());
            let bad: Vec<_> = (view.nodes.iter())
                .filter(|n| matches!(n.state, NodeState::Failed | NodeState::Skipped))
                .collect();
            assert!(
                bad.is_empty(),
                "{kind}: flow {id} has failed nodes: {bad:?}"
            );
            if view.nodes.iter().any(|n| n.state != NodeState::Done) {
                still.push(id);
            }
        }
        left = still;
        if let Some(id) = left.first() {
            assert!(
                Instant::now() < deadline,
                "{kind}: {} flows not done after {PATIENCE:?}, e.g. {:?}",
                left.len(),
                broker.flow(id).await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for q in QUEUES {
        loop {
            let s = broker.stats(q).await.expect("stats");
            if s.ready + s.pending + s.delayed == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{kind}: queue {q} still holds {s:?} after every flow is done"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let dead = broker
            .dead_len(&broker.default_dead_letter(q))
            .await
            .expect("dead_len");
        assert_eq!(dead, 0, "{kind}: dead letters of {q}");
    }
}

/// Asks the children to stop, waits for them (10 s), then kills what is left.
async fn stop(dir: &Path, children: &mut [ChildWorker]) {
    std::fs::write(dir.join("stop"), "").expect("the stop file");
    let until = Instant::now() + Duration::from_secs(10);
    for c in children.iter_mut() {
        while Instant::now() < until && matches!(c.child.try_wait(), Ok(None)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Every planned job ended, in its own flow; no job ended twice but those the kill explains.
/// The number of those.
fn check_runs(kind: &str, plan: &BTreeMap<String, Planned>, runs: &[Run], kill: &Kill) -> usize {
    let mut by_job: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        let p = plan
            .get(&r.job)
            .unwrap_or_else(|| panic!("{kind}: a run of a job no flow has: {r:?}"));
        assert_eq!(p.flow, r.flow, "{kind}: job {} ran in another flow", r.job);
        by_job.entry(&r.job).or_default().push(r);
    }
    let missing: Vec<_> = plan
        .keys()
        .filter(|id| !by_job.contains_key(id.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{kind}: jobs that never ended: {missing:?}"
    );
    let mut tolerated = 0;
    for (job, rs) in &by_job {
        if rs.len() == 1 {
            continue;
        }
        // Killed after its handler ended (less than two leases before), before its node was marked
        // done: it runs again, in another process, after the kill. (Its second run saw its node
        // not done: a handler that finds it done writes a problem.)
        let explained = rs.len() == 2
            && rs
                .iter()
                .any(|r| r.pid == kill.pid && r.end.unwrap_or(0) + 2 * LEASE.as_micros() > kill.at)
            && rs.iter().filter(|r| r.pid == kill.pid).count() == 1
            && rs
                .iter()
                .all(|r| (r.pid == kill.pid) == (r.end.unwrap_or(0) < kill.at))
            && rs.iter().any(|r| r.pid != kill.pid && r.start > kill.at);
        assert!(
            explained,
            "{kind}: job {job} (node {} of flow {}) ran to its end {} times: {rs:?} (kill of {} at {})",
            plan[*job].node,
            plan[*job].flow,
            rs.len(),
            kill.pid,
            kill.at
        );
        let first = rs
            .iter()
            .find(|r| r.pid == kill.pid)
            .expect("checked above");
        println!(
            "{kind}: job {job} (node {}) ended in the killed process {} ms before the kill, and ran again",
            plan[*job].node,
            (kill.at - first.end.unwrap_or(0)) / 1000
        );
        tolerated += 1;
    }
    tolerated
}

/// Every run of a job started after every run of each of its parents ended.
fn check_order(kind: &str, plan: &BTreeMap<String, Planned>, runs: &[Run]) {
    let mut last_end: BTreeMap<&str, u128> = BTreeMap::new();
    for r in runs {
        let e = last_end.entry(&r.job).or_default();
        *e = (*e).max(r.end.expect("an ended run"));
    }
    for r in runs {
        for parent in &plan[&r.job].parents {
            let ended = last_end[parent.as_str()];
            assert!(
                ended < r.start,
                "{kind}: job {} (node {}) started at {} µs, before its parent {parent} (node {}) ended at {ended} µs",
                r.job,
                plan[&r.job].node,
                r.start,
                plan[parent].node
            );
        }
    }
}

/// Every process ran jobs (the killed one before its kill); the jobs it was running ended
/// elsewhere.
fn check_processes(kind: &str, runs: &[Run], starts: &[Run], kill: &Kill, pids: &[u32]) {
    for pid in pids {
        let n = runs.iter().filter(|r| r.pid == *pid).count();
        assert!(n > 0, "{kind}: process {pid} ran no job (pids {pids:?})");
    }
    assert!(
        runs.iter()
            .filter(|r| r.pid == kill.pid)
            .all(|r| r.end.unwrap_or(0) < kill.at),
        "{kind}: the killed process ended a run after its kill"
    );
    assert!(
        starts.len() >= runs.len(),
        "{kind}: fewer start marks than ended runs"
    );
    for (flow, job) in &kill.running {
        assert!(
            runs.iter().any(|r| &r.flow == flow
                && &r.job == job
                && r.pid != kill.pid
                && r.start > kill.at),
            "{kind}: job {job} of flow {flow}, running in the killed process, did not end elsewhere after the kill"
        );
    }
    let mut per: BTreeMap<u32, usize> = BTreeMap::new();
    for r in runs {
        *per.entry(r.pid).or_default() += 1;
    }
    println!("{kind}: ended runs per process: {per:?}");
}

/// Each flow's last job's result is kept: its own value.
async fn check_results<B: Broker>(kind: &str, broker: &B, plan: &BTreeMap<String, Planned>) {
    for (id, p) in plan.iter().filter(|(_, p)| p.node == "j") {
        let r = broker
            .result(id)
            .await
            .expect("read a result")
            .unwrap_or_else(|| panic!("{kind}: no result kept for job {id}"));
        let v: serde_json::Value = r.get().expect("the result reads");
        assert_eq!(v["job"], id.as_str(), "{kind}: result of {id}");
        assert_eq!(v["flow"], p.flow.as_str(), "{kind}: result of {id}");
        assert_eq!(v["node"], "j", "{kind}: result of {id}");
    }
}

mod flows_across_processes {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::run("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::run("postgres").await;
    }
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        super::run("redis").await;
    }
    #[ignore = "needs a Redis Cluster: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_cluster() {
        super::run("cluster").await;
    }
}
