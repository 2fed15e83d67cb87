//! End-to-end tests: the real `dsc` binary on generated data, one module per topic.

mod util;

mod bad_input;
mod cold;
mod determinism;
mod docs;
mod encoded;
mod generations;
mod hostile;
mod inspection;
mod keys;
mod layering;
mod lists;
mod loader;
mod mix;
mod mostlyai;
mod pack;
mod parsers;
mod python;
mod records;
mod remote;
mod replace;
mod scale;
mod series;
mod spec_file;
mod splits;
mod timings;
mod values;
mod verify;
mod work;
