//! Packed batches from Rust: one epoch of packs of 32,768 tokens, each sequence found through
//! `cu_seqlens`, the resume state taken halfway.
//!
//! cargo run --release -p dsc-loader --example packs -- demo/cache
use dsc_loader::{Batches, Cache, LoaderOptions, OrderSpec, Pack};

fn i32s(bytes: &[u8]) -> impl Iterator<Item = i32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "demo/cache".into());
    let cache = Cache::open(&dir)?;
    let opts = LoaderOptions {
        order: OrderSpec {
            batches: Batches::Packed(Pack::tokens(32_768)),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut loader = cache.loader(opts.clone())?;
    let packs = loader.packs().expect("a packed loader");
    let (tokens, max_seqs) = (packs.tokens(), packs.max_seqs());
    println!(
        "{} packs of {tokens} tokens and at most {max_seqs} sequences this epoch",
        loader.steps()
    );
    let (mut stored, mut seqs) = (0usize, 0usize);
    for batch in (&mut loader).take(2) {
        let batch = batch?;
        let pack = batch.pack.expect("packed");
        // Per-step tensors are [T, ..], per-context ones [S, ..]; sequence i holds tokens
        // cu_seqlens[i]..cu_seqlens[i + 1] and row i of every per-context tensor.
        let x = batch.tensor("x").ok_or("no x")?;
        let cu: Vec<i32> = i32s(batch.tensor("cu_seqlens").ok_or("no cu")?.bytes()).collect();
        let features = x.shape()[1];
        let first = &x.bytes()[cu[0] as usize * features * 4..cu[1] as usize * features * 4];
        println!(
            "step {}: {} sequences, {} tokens (longest {}); x of sequence 0 is {:?}, {} floats",
            batch.step,
            pack.seqs,
            pack.tokens,
            pack.max_seqlen,
            x.shape(),
            first.len() / 4
        );
        stored += pack.tokens;
        seqs += pack.seqs;
    }
    println!(
        "token efficiency of these packs {:.4}; {seqs} sequences",
        stored as f64 / (2 * tokens) as f64
    );
    // A state names the pack to continue from; the order comes with it.
    let state = loader.state();
    let rest = cache.loader_from_state(opts, &state)?.count();
    println!("resumed after {} packs: {rest} more", state.samples);
    Ok(())
}
