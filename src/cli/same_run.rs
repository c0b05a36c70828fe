//! Under `mpirun`/`srun`, before a command does anything else, every rank checks that it was
//! started like every other: the same command, and for `train` the same flags that decide the
//! run (model and its shape, data and the file's identity, seed, batch, steps, optimizer and
//! its settings, precision, schedule, strategy, `--shard`, `--bucket-size`, `--grad-dtype`,
//! `--offload-optimizer`, the `--plan` file by its content, checkpointing). Ranks started
//! differently (an MPMD launch `mpirun -np 1 tandem train … : -np 1 tandem train … --seed 2`,
//! or one machine's copy of the data file that differs) would train apart or wait for each
//! other forever; instead the job ends at once, on every rank, with a message that names each
//! flag that differs and every rank's value: `--seed: rank 0 = 1, rank 1 = 2`.
//!
//! A data file is identified by its path, its size and a SHA-256 of its first and last MiB (the
//! whole file when smaller), so that checking costs milliseconds whatever the file's size; a
//! directory (`mnist:DIR`) by the same of each of its files. Flags that only rank 0 acts on
//! (`--save`, `--plot`, `--trace`, `--log-format`, where the checkpoints go) and `--init`
//! (rank 0's weights start every replica) may differ, and so may the devices a rank trains
//! on, their `--memory-limit` and `--recalibrate` (each rank's calibration is gathered before
//! rank 0 plans); `RANK_LOCAL` lists them with the reasons. A job may mix kinds of device
//! (one rank on a CUDA GPU, another on a Vulkan adapter), as one process may; the ranks then
//! agree on the collectives (NCCL only when every rank's devices are CUDA GPUs) and the batch
//! shares (by measured speed). `bench` still needs one kind of device on every rank. Flags
//! compare as given: `--lr 0.01` and the default 0.01 count as different.
use super::ranks::Ranks;
use super::Failure;
use super::{BenchArgs, Command, ModelArg, TrainArgs};
use sha2::{Digest, Sha256};
use std::fmt::Display;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use tandem::{Error, Result};

/// One flag and its value on this rank, as the message shows it.
type Entry = (String, String);

/// Bytes of each end of a data file that its identity hashes.
const END_BYTES: u64 = 1 << 20;
/// Most values of one flag, and most flags, that a message lists.
const MOST: usize = 8;

/// Ends the command with an error naming the flags and ranks that differ, when the ranks were
/// not started alike (see the module docs). Collective: every rank calls it first; alone it
/// does nothing.
pub fn check(command: &Command, ranks: &Ranks) -> Result<(), Failure> {
    if !ranks.many() {
        return Ok(());
    }
    let mine = serde_json::to_vec(&entries(command, ranks)).map_err(|e| Error::Msg(format!("encoding the run configuration: {e}")))?;
    let all = tandem::train::ranks::gather_bytes(ranks.group(), &mine)?
        .iter()
        .enumerate()
        .map(|(rank, bytes)| {
            serde_json::from_slice::<Vec<Entry>>(bytes)
                .map_err(|e| Error::Msg(format!("rank {rank} sent a run configuration that does not read back: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let differ = differences(&all);
    if differ.is_empty() {
        return Ok(());
    }
    Err(Failure::Usage(format!(
        "the ranks were not started with the same run configuration (every rank must run the same command with the same flags and data): {}",
        differ.join("; ")
    )))
}

/// Each flag whose value is not the same on every rank, with every rank's value: `--seed:
/// rank 0 = 1, rank 1 = 2` (ranks with one value are listed together).
fn differences(all: &[Vec<Entry>]) -> Vec<String> {
    let mut flags: Vec<&str> = Vec::new();
    for (flag, _) in all.iter().flatten() {
        if !flags.contains(&flag.as_str()) {
            flags.push(flag);
        }
    }
    let mut out = Vec::new();
    for flag in flags {
        let value = |entries: &Vec<Entry>| entries.iter().find(|(f, _)| f == flag).map_or_else(|| "(not checked)".to_string(), |(_, v)| v.clone());
        let mut values: Vec<(String, Vec<usize>)> = Vec::new();
        for (rank, entries) in all.iter().enumerate() {
            let v = value(entries);
            match values.iter_mut().find(|(x, _)| *x == v) {
                Some((_, ranks)) => ranks.push(rank),
                None => values.push((v, vec![rank])),
            }
        }
        if values.len() > 1 {
            let mut said: Vec<String> = values.iter().take(MOST).map(|(v, ranks)| format!("{} = {v}", tandem::dist::rank_list(ranks))).collect();
            if values.len() > MOST {
                said.push(format!("and {} other values", values.len() - MOST));
            }
            out.push(format!("{flag}: {}", said.join(", ")));
        }
    }
    if out.len() > MOST {
        let more = out.len() - MOST;
        out.truncate(MOST);
        out.push(format!("and {more} other flags"));
    }
    out
}

/// What this rank was asked to do, flag by flag.
fn entries(command: &Command, ranks: &Ranks) -> Vec<Entry> {
    let mut e = Entries(Vec::new());
    match command {
        Command::Bench(args) => bench(&mut e, args, ranks),
        other => command_flags(&mut e, other),
    }
    e.0
}

/// What a command other than `bench` (whose devices need the ranks) was asked to do.
fn command_flags(e: &mut Entries, command: &Command) {
    match command {
        Command::Devices => e.add("command", "devices"),
        Command::Generate(_) => e.add("command", "generate"),
        Command::ExportHf(_) => e.add("command", "export-hf"),
        Command::Bench(_) => {}
        Command::Train(args) => {
            e.add("command", "train");
            train(e, args);
        }
        Command::Plan(args) => {
            e.add("command", "plan");
            train(e, &args.train);
            e.opt("--cluster", args.cluster.as_ref());
        }
    }
}

struct Entries(Vec<Entry>);

impl Entries {
    fn add(&mut self, flag: &str, value: impl Display) {
        self.0.push((flag.to_string(), value.to_string()));
    }
    fn opt(&mut self, flag: &str, value: Option<impl Display>) {
        self.add(flag, value.map_or_else(|| "not given".to_string(), |v| v.to_string()));
    }
    fn debug(&mut self, flag: &str, value: impl std::fmt::Debug) {
        self.add(flag, format!("{value:?}").to_lowercase());
    }
}

fn bench(e: &mut Entries, args: &BenchArgs, ranks: &Ranks) {
    e.add("command", "bench");
    e.opt("--bench", args.bench.as_ref());
    e.opt("--model", args.model.as_ref());
    e.add("--quick", args.quick);
    e.add("--devices", device_kinds(&args.devices, ranks));
}

/// The flags of `train` (and `plan`) that decide the run's trajectory or the shapes of its
/// collectives; every other flag is in [`RANK_LOCAL`].
fn train(e: &mut Entries, args: &TrainArgs) {
    e.add(
        "--model",
        match args.model {
            ModelArg::Seed(m) => super::setup::model_name(m),
            ModelArg::Gpt => "gpt",
        },
    );
    e.add("--data", data_identity(&args.data));
    e.opt("--steps", args.steps);
    e.opt("--epochs", args.epochs);
    e.add("--batch", args.batch);
    e.opt("--optimizer", args.optimizer.map(|o| format!("{o:?}").to_lowercase()));
    e.opt("--lr", args.lr);
    e.add("--momentum", args.momentum);
    e.opt("--weight-decay", args.weight_decay);
    e.opt("--grad-clip", args.grad_clip);
    let g = &args.gpt;
    e.opt("--n-layer", g.n_layer);
    e.opt("--n-head", g.n_head);
    e.opt("--n-embd", g.n_embd);
    e.opt("--block-size", g.block_size);
    e.opt("--dropout", g.dropout);
    e.opt("--warmup-steps", g.warmup_steps);
    e.opt("--eval-every", g.eval_every);
    e.opt("--order", g.order.map(|o| format!("{o:?}").to_lowercase()));
    e.opt("--val-data", g.val_data.as_deref().map(data_identity));
    e.opt("--tokenizer", g.tokenizer.map(|t| format!("{t:?}").to_lowercase()));
    e.add("--seed", args.seed);
    e.debug("--strategy", args.strategy);
    // By content: one plan copied to each machine may sit under different paths.
    e.opt("--plan", args.plan.as_deref().map(path_identity));
    e.opt("--balance", args.balance.map(|b| format!("{b:?}").to_lowercase()));
    e.opt("--micro-batches", args.micro_batches);
    e.debug("--schedule", args.schedule);
    e.opt("--pipelines", args.pipelines);
    e.opt("--tensor", args.tensor);
    e.add("--recompute", args.recompute);
    e.add("--deterministic", args.deterministic);
    e.debug("--precision", args.precision);
    e.add("--search-precision", args.search_precision);
    e.debug("--shard", args.shard);
    e.add("--bucket-size", args.bucket_size);
    e.debug("--grad-dtype", args.grad_dtype);
    e.add("--offload-optimizer", args.offload_optimizer);
    // Trials are collective steps: a rank that skips them would leave the others waiting.
    e.add("--no-trials", args.no_trials);
    // Where the checkpoints go is rank 0's (rank-local); whether there are any decides when
    // all ranks wait.
    e.add("--checkpoint-dir", if args.checkpoint_dir.is_some() { "given" } else { "not given" });
    e.opt("--checkpoint-every", args.checkpoint_every);
    e.add("--resume", args.resume);
}

/// The flags of `train` and `plan` that may differ between ranks, each with the reason. A flag
/// added to the command line must be agreed in [`train`] or listed here (a test checks it).
#[cfg_attr(not(test), allow(dead_code))]
const RANK_LOCAL: &[(&str, &str)] = &[
    ("--init", "rank 0's weights start every replica; the others receive them"),
    ("--save", "only rank 0 writes the final weights"),
    ("--overwrite-checkpoints", "only rank 0 opens the checkpoint directory"),
    ("--log-format", "only rank 0 prints the log"),
    ("--trace", "only rank 0 writes the trace"),
    ("--plot", "only rank 0 writes the plot"),
    ("--devices", "each rank trains on its own devices, of any kind"),
    ("--memory-limit", "a budget of this rank's devices, gathered with its calibration before rank 0 plans"),
    ("--recalibrate", "whether this rank measures its own devices again; rank 0 plans on every rank's measurements"),
    ("--save-plan", "only rank 0 writes the plan"),
];

/// The backends of this rank's share of `--devices` (`cuda`, `cpu,wgpu`): the ranks of a
/// benchmark may drive different GPUs, not different kinds of device (its figures would not
/// be of one kind).
fn device_kinds(spec: &str, ranks: &Ranks) -> String {
    let g = ranks.group();
    let local = tandem::dist::local_spec(spec, g.local_rank(), g.local_size()).unwrap_or_else(|_| spec.to_string());
    let mut kinds: Vec<&str> = local.split(',').map(|d| d.trim().split(':').next().unwrap_or("")).filter(|k| !k.is_empty()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds.join(",")
}

/// `--data` with the identity of the file or directory it names, if it names one.
fn data_identity(data: &str) -> String {
    let path = match (data.strip_prefix("text:"), data.strip_prefix("mnist:")) {
        (Some(p), _) | (_, Some(p)) => p,
        _ if data.ends_with(".safetensors") => data,
        _ => return data.to_string(),
    };
    format!("{data} ({})", path_identity(Path::new(path)))
}

fn path_identity(path: &Path) -> String {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return format!("cannot be read: {e}"),
    };
    if !meta.is_dir() {
        return match file_digest(path) {
            Ok((len, digest)) => format!("{len} bytes, sha256 of its ends {digest}"),
            Err(e) => format!("cannot be read: {e}"),
        };
    }
    let mut names: Vec<_> = match std::fs::read_dir(path) {
        Ok(d) => d.filter_map(|e| e.ok()).filter(|e| e.path().is_file()).map(|e| e.file_name()).collect(),
        Err(e) => return format!("cannot be read: {e}"),
    };
    names.sort();
    let mut h = Sha256::new();
    for name in &names {
        let id = file_digest(&path.join(name)).map_or_else(|e| e.to_string(), |(len, d)| format!("{len}:{d}"));
        h.update(format!("{}={id};", name.to_string_lossy()).as_bytes());
    }
    format!("directory of {} files, sha256 {}", names.len(), hex(&h.finalize()[..8]))
}

/// A file's length and a SHA-256 (its first 8 bytes, in hex) of the length and of its first
/// and last [`END_BYTES`].
fn file_digest(path: &Path) -> std::io::Result<(u64, String)> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let mut h = Sha256::new();
    h.update(len.to_le_bytes());
    let mut buf = Vec::new();
    (&mut f).take(END_BYTES).read_to_end(&mut buf)?;
    h.update(&buf);
    if len > 2 * END_BYTES {
        f.seek(SeekFrom::Start(len - END_BYTES))?;
    }
    buf.clear();
    f.take(END_BYTES).read_to_end(&mut buf)?;
    h.update(&buf);
    Ok((len, hex(&h.finalize()[..8])))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(values: &[(&str, &str)]) -> Vec<Entry> {
        values.iter().map(|(f, v)| (f.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_differing_flag_is_named_with_every_rank_value() {
        let a = run(&[("command", "train"), ("--seed", "1"), ("--batch", "64")]);
        let b = run(&[("command", "train"), ("--seed", "2"), ("--batch", "64")]);
        assert!(differences(&[a.clone(), a.clone()]).is_empty());
        assert_eq!(differences(&[a.clone(), b.clone(), a.clone()]), vec!["--seed: ranks 0, 2 = 1, rank 1 = 2".to_string()]);
        let c = run(&[("command", "devices")]);
        let d = differences(&[a, c]);
        assert_eq!(d[0], "command: rank 0 = train, rank 1 = devices");
        assert!(d[1].starts_with("--seed: rank 0 = 1, rank 1 = (not checked)"), "{d:?}");
    }

    /// Every long flag of `tandem`'s subcommand `name`.
    fn long_flags(name: &str) -> Vec<String> {
        use clap::CommandFactory;
        let cli = super::super::Cli::command();
        let sub = cli.find_subcommand(name).unwrap_or_else(|| panic!("no subcommand {name}"));
        sub.get_arguments().filter_map(|a| a.get_long()).filter(|l| !["help", "version"].contains(l)).map(|l| format!("--{l}")).collect()
    }

    /// The flags a command line is checked by.
    fn of(args: &[&str]) -> Vec<Entry> {
        use clap::Parser;
        let mut e = Entries(Vec::new());
        command_flags(&mut e, &super::super::Cli::try_parse_from(args).unwrap().command);
        e.0
    }

    #[test]
    fn every_flag_of_train_and_plan_is_agreed_or_rank_local() {
        for name in ["train", "plan"] {
            let agreed: Vec<String> = of(&["tandem", name]).into_iter().map(|(flag, _)| flag).collect();
            let local: Vec<&str> = RANK_LOCAL.iter().map(|(flag, _)| *flag).collect();
            let flags = long_flags(name);
            for flag in &flags {
                assert!(
                    agreed.contains(flag) || local.contains(&flag.as_str()),
                    "{name} {flag} is neither agreed by the ranks (same_run::train) nor listed in RANK_LOCAL with a reason"
                );
                assert!(!(agreed.contains(flag) && local.contains(&flag.as_str())), "{name} {flag} is both agreed and rank-local");
            }
            for flag in agreed.iter().filter(|f| f.starts_with("--")) {
                assert!(flags.contains(flag), "{name} has no flag {flag}, yet it is agreed");
            }
        }
        let all: Vec<String> = ["train", "plan"].iter().flat_map(|n| long_flags(n)).collect();
        for (flag, reason) in RANK_LOCAL {
            assert!(all.contains(&flag.to_string()), "RANK_LOCAL lists {flag}, which train and plan lack");
            assert!(!reason.is_empty());
        }
    }

    #[test]
    fn a_plan_and_a_train_differ_by_command() {
        let d = differences(&[of(&["tandem", "train"]), of(&["tandem", "plan"])]);
        assert_eq!(d[0], "command: rank 0 = train, rank 1 = plan", "{d:?}");
        let d = differences(&[of(&["tandem", "train"]), of(&["tandem", "train", "--precision", "bf16", "--shard", "grads"])]);
        assert_eq!(d, vec!["--precision: rank 0 = f32, rank 1 = bf16".to_string(), "--shard: rank 0 = none, rank 1 = grads".to_string()]);
    }

    #[test]
    fn a_file_is_known_by_its_size_and_both_ends() {
        let dir = std::env::temp_dir().join(format!("tandem-same-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.txt"), dir.join("b.txt"));
        let mut big = vec![7u8; (3 * END_BYTES) as usize];
        std::fs::write(&a, &big).unwrap();
        let first = path_identity(&a);
        *big.last_mut().unwrap() = 8;
        std::fs::write(&b, &big).unwrap();
        assert_ne!(first, path_identity(&b), "the last byte differs");
        std::fs::write(&b, &big[..big.len() - 1]).unwrap();
        assert_ne!(first, path_identity(&b), "the length differs");
        assert!(data_identity(&format!("text:{}", a.display())).contains(&format!("{} bytes", 3 * END_BYTES)));
        assert_eq!(data_identity("digits"), "digits");
        assert!(path_identity(&dir.join("missing")).starts_with("cannot be read"));
        assert!(path_identity(&dir).starts_with("directory of 2 files"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
