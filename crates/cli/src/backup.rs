//! `atomos backup` and `atomos restore`: a backup of a live certify or active cluster taken
//! through one member, checked; and the data directory of a member of a new cluster seeded
//! from one.

use std::path::Path;
use std::time::Duration;

use atomos::backup::{Backup, BackupHeader};
use atomos::Client;

/// Takes a backup through the cluster that the client configuration at `client` names and
/// writes it to `out`, waiting up to `wait`.
pub(crate) fn take(client: &Path, out: &Path, wait: Duration) -> Result<bool, String> {
    if out.exists() {
        return Err(format!(
            "--out: {} exists; a backup never replaces a file",
            out.display()
        ));
    }
    let cfg = atomos::config::load_client(client).map_err(|e| format!("--client: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let header = runtime.block_on(async move {
        let client = Client::connect(cfg).await.map_err(|e| e.to_string())?;
        let header = client.backup(out, wait).await.map_err(|e| e.to_string());
        client.close();
        header
    })?;
    println!("wrote {}", out.display());
    print!("{}", describe(&header));
    Ok(true)
}

/// Checks the backup at `file` (its checksums, and that its parts decode) and says what it
/// holds.
pub(crate) fn verify(file: &Path) -> Result<bool, String> {
    let backup = Backup::read(file).map_err(|e| e.to_string())?;
    println!("{}: a whole backup", file.display());
    print!("{}", describe(&backup.header));
    Ok(true)
}

/// Seeds `dir` as the data directory of a member of a new cluster of `members` from the backup
/// at `file`.
pub(crate) fn restore(file: &Path, dir: &Path, members: &str) -> Result<bool, String> {
    let ids = parse_members(members)?;
    let backup = Backup::read(file).map_err(|e| e.to_string())?;
    let log = backup
        .restore(dir, &ids)
        .map_err(|e| format!("--dir: {e}"))?;
    println!(
        "seeded {} from {} (position {}): start each of members {members} with \
         protocol = {:?} and its own seeded data directory",
        log.display(),
        file.display(),
        backup.header.index,
        backup.header.protocol
    );
    Ok(true)
}

/// The ids of `--members` (comma-separated, each once, none 0 or a client's).
fn parse_members(members: &str) -> Result<Vec<u64>, String> {
    let mut ids = Vec::new();
    for part in members.split(',') {
        let id: u64 = part
            .trim()
            .parse()
            .map_err(|_| format!("--members: {part:?} is not a member id"))?;
        if id == 0 || atomos::net::transport::is_client(id) {
            return Err(format!("--members: {id} is not a member id"));
        }
        if ids.contains(&id) {
            return Err(format!("--members: {id} is given twice"));
        }
        ids.push(id);
    }
    Ok(ids)
}

fn describe(h: &BackupHeader) -> String {
    format!(
        "  protocol {}\n  position {} (term {}), log time {} ms\n  taken at {} ms by member {}\n  \
         {} bytes of tables, {} bytes of state\n",
        h.protocol, h.index, h.term, h.log_time, h.taken_ms, h.source, h.tables_len, h.state_len
    )
}

#[cfg(test)]
mod tests {
    use super::parse_members;

    #[test]
    fn members_are_ids_each_once() {
        assert_eq!(parse_members("4, 5,6"), Ok(vec![4, 5, 6]));
        for bad in ["", "4,,5", "0", "4,4", "x", "18446744073709551615"] {
            assert!(parse_members(bad).is_err(), "{bad:?}");
        }
    }
}
