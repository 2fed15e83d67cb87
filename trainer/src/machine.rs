//! Settings a run leaves to its machine (the device, the precision, the rounding of trimmed
//! lengths) are chosen once, written into its [`RunConfig`], and so saved in its checkpoints:
//! a resume keeps them on any machine, and changes one only when the command line names
//! another, which it reports. (A GPU machine resumed a CPU run on CUDA in bf16, silently,
//! before.) Where the split lives (`resident`) changes no batch and is left to each machine.

use crate::config::{defaults, Amp, RunConfig};

/// A setting a resume changed because the command line asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The setting's flag name (`device`, `amp`).
    pub setting: &'static str,
    /// What the saved run had.
    pub recorded: String,
    /// What the resumed run uses.
    pub now: String,
}

/// The device to ask for: the one the command line `given`, else the one the resumed run
/// `recorded`, else `auto`.
pub fn device_wanted<'a>(given: Option<&'a str>, recorded: Option<&'a str>) -> &'a str {
    given.or(recorded).unwrap_or("auto")
}

/// Settles `cfg`'s machine-chosen settings for the device it runs on (`device`, named as
/// [`crate::device::name`] names it; `cuda`: whether it is a GPU): what the run recorded
/// stays, what it left open is chosen now and recorded; `amp` given on the command line
/// replaces the recorded one. `graph_open`: a new run whose command line left `--graph` to the
/// machine, which captures the step on CUDA wherever the batch shape is static (padded batches
/// then untrimmed). Returns what a resume changes (the device, when the command line named
/// another than the recorded one; the precision, when asked).
pub fn settle(
    cfg: &mut RunConfig,
    device: &str,
    cuda: bool,
    amp: Option<Amp>,
    graph_open: bool,
) -> Vec<Change> {
    let mut changes = Vec::new();
    if let Some(recorded) = cfg.device.as_deref().filter(|r| *r != device) {
        changes.push(Change {
            setting: "device",
            recorded: recorded.into(),
            now: device.into(),
        });
    }
    cfg.device = Some(device.into());
    if let (Some(recorded), Some(asked)) = (cfg.amp, amp) {
        if recorded != asked {
            changes.push(Change {
                setting: "amp",
                recorded: recorded.to_string(),
                now: asked.to_string(),
            });
        }
    }
    cfg.amp = Some(
        amp.or(cfg.amp)
            .unwrap_or(if cuda { Amp::Bf16 } else { Amp::None }),
    );
    let batches = cfg.batches();
    if graph_open {
        cfg.graph = cuda && !batches.is_bucketed() && cfg.shape.trim_multiple.is_none();
    }
    // Packs, windows and captured steps have one shape: nothing to trim or round.
    cfg.shape.trim = batches.is_padded() && !cfg.graph;
    if cfg.shape.trim {
        cfg.shape
            .trim_multiple
            .get_or_insert(if cuda { defaults::GPU_TRIM_MULTIPLE } else { 1 });
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Task;

    /// The machine is injected: a run recorded on the CPU, resumed where `auto` would pick a
    /// GPU (`cuda: true`, the device asked for being the recorded one).
    #[test]
    fn a_resume_keeps_what_its_run_chose() {
        let mut cfg = RunConfig::new("cache", Task::Regression);
        assert!(settle(&mut cfg, "cpu", false, None, false).is_empty());
        assert_eq!(
            (cfg.device.as_deref(), cfg.amp, cfg.shape.trim_multiple),
            (Some("cpu"), Some(Amp::None), Some(1))
        );
        // Resumed on a GPU machine without --device: the recorded device is asked for.
        assert_eq!(device_wanted(None, cfg.device.as_deref()), "cpu");
        let mut resumed = cfg.clone();
        assert!(settle(&mut resumed, "cpu", false, None, false).is_empty());
        assert_eq!(resumed, cfg);
        // Had the device been chosen anew there (CUDA), the precision and the trimming would
        // still be the recorded ones, and the change of device is reported.
        let mut moved = cfg.clone();
        let changes = settle(&mut moved, "cuda:0", true, None, false);
        assert_eq!(
            (moved.amp, moved.shape.trim_multiple),
            (Some(Amp::None), Some(1))
        );
        assert_eq!(
            changes,
            vec![Change {
                setting: "device",
                recorded: "cpu".into(),
                now: "cuda:0".into()
            }]
        );
        // A precision asked for replaces the recorded one, and says so.
        let changes = settle(&mut moved, "cuda:0", true, Some(Amp::Bf16), false);
        assert_eq!(moved.amp, Some(Amp::Bf16));
        assert_eq!(changes[0].setting, "amp");
        assert_eq!(device_wanted(Some("cuda"), Some("cpu")), "cuda");
    }

    /// A new run on a GPU records bf16 and the GPU's trim multiple; an old checkpoint without
    /// them gets today's choice for its device (what it ran with before); a packed run has no
    /// trim multiple to record.
    #[test]
    fn a_new_run_records_the_machine_choice() {
        let mut cfg = RunConfig::new("cache", Task::Regression);
        settle(&mut cfg, "cuda:0", true, None, false);
        assert_eq!(
            (cfg.device.as_deref(), cfg.amp, cfg.shape.trim_multiple),
            (
                Some("cuda:0"),
                Some(Amp::Bf16),
                Some(defaults::GPU_TRIM_MULTIPLE)
            )
        );
        let mut explicit = RunConfig::new("cache", Task::Regression);
        explicit.shape.trim_multiple = Some(4);
        settle(&mut explicit, "cpu", false, Some(Amp::Bf16), false);
        assert_eq!(
            (explicit.amp, explicit.shape.trim_multiple),
            (Some(Amp::Bf16), Some(4))
        );
        let mut packed = RunConfig::new("cache", Task::Regression);
        packed.shape.pack = Some(4096);
        settle(&mut packed, "cuda:0", true, None, false);
        assert_eq!(packed.shape.trim_multiple, None, "packs have one shape");
        packed.validate().unwrap();
    }

    /// `--graph` left to the machine: a new run on CUDA captures its step (padded batches
    /// untrimmed, packs as they are), one on the CPU or with bucketed batches runs eagerly;
    /// the choice is recorded, and a resume elsewhere keeps it. The machine is injected.
    #[test]
    fn a_new_run_on_cuda_captures_and_a_resume_keeps_it() {
        let mut gpu = RunConfig::new("cache", Task::Regression);
        settle(&mut gpu, "cuda:0", true, None, true);
        assert_eq!((gpu.graph, gpu.shape.trim_multiple), (true, None));
        gpu.validate().unwrap();
        let mut resumed = gpu.clone();
        settle(&mut resumed, "cpu", false, None, false);
        assert_eq!((resumed.graph, resumed.shape.trim_multiple), (true, None));

        let mut cpu = RunConfig::new("cache", Task::Regression);
        settle(&mut cpu, "cpu", false, None, true);
        assert_eq!((cpu.graph, cpu.shape.trim_multiple), (false, Some(1)));

        let mut bucketed = RunConfig::new("cache", Task::Regression);
        bucketed.shape.bucket = true;
        settle(&mut bucketed, "cuda:0", true, None, true);
        assert!(!bucketed.graph);
        let mut packed = RunConfig::new("cache", Task::Regression);
        packed.shape.pack = Some(4096);
        settle(&mut packed, "cuda:0", true, None, true);
        assert_eq!((packed.graph, packed.shape.trim_multiple), (true, None));
    }
}
