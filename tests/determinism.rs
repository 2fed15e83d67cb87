//! The same inputs and seed give byte-identical caches whatever the thread count; the shuffle
//! seed changes the order and nothing else; the split does not depend on the shuffle seed.

use crate::util::*;

#[test]
fn same_seed_gives_identical_bytes_with_one_and_two_threads() {
    let dir = Dir::new();
    gen_icecube(&dir, 3, 200);
    gen_sequences(&dir, 200, 3);
    let with_threads = |threads: &str, args: Vec<String>| -> Vec<String> {
        ["--threads", threads]
            .map(String::from)
            .into_iter()
            .chain(args)
            .collect()
    };
    let ice = |out: &str| -> Vec<String> {
        icecube_args(out, &["--shard-size", "256KiB"])
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    for (a, b, args_a, args_b) in [
        (
            "ice1",
            "ice2",
            with_threads("1", ice("ice1")),
            with_threads("2", ice("ice2")),
        ),
        (
            "seq1",
            "seq2",
            with_threads("1", sequences_args("seq1")),
            with_threads("2", sequences_args("seq2")),
        ),
    ] {
        for args in [&args_a, &args_b] {
            dsc(
                dir.path(),
                &args.iter().map(String::as_str).collect::<Vec<_>>(),
            )
            .ok();
        }
        let (ta, tb) = (tree(&dir.join(a)), tree(&dir.join(b)));
        assert_eq!(ta.keys().collect::<Vec<_>>(), tb.keys().collect::<Vec<_>>());
        assert!(ta.len() > 3, "several shards: {:?}", ta.keys());
        for (name, bytes) in &ta {
            let other = &tb[name];
            let manifest_or_not = if name == "manifest.json" {
                // The manifest records the output path nowhere, so it must match byte for byte.
                String::from_utf8_lossy(bytes).into_owned()
            } else {
                String::new()
            };
            assert!(
                bytes == other,
                "{a}/{name} differs from {b}/{name} {manifest_or_not}"
            );
        }
    }
}

#[test]
fn another_seed_changes_only_the_order() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 200);
    // Seeded truncation must not follow the shuffle seed either.
    dsc(dir.path(), &icecube_args("a", &["--truncate", "sample"])).ok();
    let mut args = icecube_args("b", &["--truncate", "sample"]);
    let pos = args.iter().position(|a| *a == "42").unwrap();
    args[pos] = "43";
    dsc(dir.path(), &args).ok();
    let (sa, oa) = read_cache(&dir.join("a"));
    let (sb, ob) = read_cache(&dir.join("b"));
    assert_eq!(
        sa, sb,
        "every context holds the same values in the same split"
    );
    assert_ne!(oa["train"], ob["train"], "the order differs");
    assert_eq!(
        std::fs::read(dir.join("a/stats.json")).unwrap(),
        std::fs::read(dir.join("b/stats.json")).unwrap(),
        "statistics do not depend on the shuffle"
    );
    let (ma, mb) = (manifest(&dir.join("a")), manifest(&dir.join("b")));
    assert_eq!(
        ma["tensors"], mb["tensors"],
        "encodings do not depend on the shuffle"
    );
    assert_eq!(ma["splits"], mb["splits"]);
}

#[test]
fn split_seed_moves_contexts_between_splits() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 200);
    dsc(dir.path(), &icecube_args("a", &[])).ok();
    dsc(dir.path(), &icecube_args("b", &["--split-seed", "9"])).ok();
    let (_, oa) = read_cache(&dir.join("a"));
    let (_, ob) = read_cache(&dir.join("b"));
    let mut va = oa["val"].clone();
    let mut vb = ob["val"].clone();
    va.sort_unstable();
    vb.sort_unstable();
    assert_ne!(va, vb);
}

#[test]
fn thread_counts_from_1_to_16_give_byte_identical_caches() {
    let dir = Dir::new();
    gen_icecube(&dir, 4, 150);
    let mut first = None;
    for threads in ["1", "3", "7", "16"] {
        let out = format!("ice{threads}");
        let args = [
            &["--threads", threads][..],
            &icecube_args(&out, &["--shard-size", "128KiB"]),
        ]
        .concat();
        dsc(dir.path(), &args).ok();
        let t = tree(&dir.join(&out));
        assert!(t.len() > 4, "several shards: {:?}", t.keys());
        match &first {
            None => first = Some(t),
            Some(f) => assert!(f == &t, "{threads} threads wrote other bytes than 1"),
        }
    }
}
