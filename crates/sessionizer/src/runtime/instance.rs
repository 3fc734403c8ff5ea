//! A job's instance id: the name its outputs know it by (a Kafka output's transactional
//! id, a Delta table's application id and data file names), made up on the job's first
//! run and kept in its state directory, so that every later run of the job has it.

use crate::error::RunError;

/// A made-up instance name for a process that has none.
pub(crate) fn random_instance() -> String {
    use std::hash::{BuildHasher, Hasher};
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(seed);
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// The instance name kept in the state directory (made up and stored on first use), so
/// that a restarted process fences its predecessor's transaction at once.
pub(crate) fn persisted_instance(dir: &std::path::Path) -> Result<String, RunError> {
    let path = dir.join("instance-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(RunError::Resume {
                dir: dir.display().to_string(),
                message: format!("cannot read {}: {e}", path.display()),
            });
        }
    }
    let id = random_instance();
    std::fs::write(&path, format!("{id}\n")).map_err(|e| RunError::Resume {
        dir: dir.display().to_string(),
        message: format!("cannot write {}: {e}", path.display()),
    })?;
    Ok(id)
}
