//! Links the agent as a position-dependent executable.
//!
//! A position-independent one has its 450 KiB of `.data.rel.ro` (vtables,
//! function-pointer tables) relocated by the dynamic loader at every start,
//! which dirties those pages: 40% of an idle agent's own memory, repeated in
//! each of the thousands of agents a machine runs. Linked at a fixed address,
//! the section stays a clean page-cache mapping that every agent shares. The
//! cost is that the agent's own code is not address-randomised (its
//! libraries, heap and stacks still are).

fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
}
