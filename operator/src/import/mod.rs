//! Converting other labs' topology files into Nextmini manifests.

pub mod containerlab;
