//! The memory behind NCCL's device API (`include/nccl_device.h`): the C layouts the library
//! shares with the header's inline device code (`abi`), where a device communicator keeps its
//! barriers and signals (`plan`), how ranks share device memory (`mem`), and what a
//! communicator holds until it is released (`state`). The setups that fill them are collective
//! and run in `setup`; the entry points are in `devapi` and `misc`.

pub(crate) mod abi;
pub(crate) mod mem;
pub(crate) mod plan;
pub(crate) mod state;

pub(crate) use state::State;
