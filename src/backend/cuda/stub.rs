//! A generated stub shared object that gives a library found under one name the soname cudarc
//! opens it by (see `libs.rs`).
//!
//! The stub holds no code: an ELF header, one read-write `PT_LOAD`, a `PT_DYNAMIC` with
//! `DT_SONAME` = the name cudarc asks for and `DT_NEEDED` = the file found, an empty symbol and
//! hash table, and `PT_GNU_STACK` (no executable stack). Once it is loaded, the dynamic loader
//! answers `dlopen("libnvrtc.so")` with it, and `dlsym` on that handle searches its dependency,
//! the real library. It is written to a temporary file only this user may read or write (mode
//! 0600), loaded, and the file removed.
use std::path::Path;

const EHDR: usize = 64;
const PHDR: usize = 56;
const PHNUM: usize = 3;
const DYN_ENTRIES: usize = 8;
/// `p_align` of the load segment: a multiple of every page size Linux uses (4 KiB to 64 KiB).
const ALIGN: u64 = 0x10000;

#[cfg(target_arch = "x86_64")]
const MACHINE: u16 = 62;
#[cfg(target_arch = "aarch64")]
const MACHINE: u16 = 183;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const MACHINE: u16 = 0;

/// The bytes of a stub named `soname` that needs `needed` (a path or a name).
pub(crate) fn elf(soname: &str, needed: &str) -> Vec<u8> {
    let dyn_off = EHDR + PHDR * PHNUM;
    let hash_off = dyn_off + 16 * DYN_ENTRIES;
    let sym_off = hash_off + 16;
    let str_off = sym_off + 24;
    let mut strtab = vec![0u8];
    let soname_at = strtab.len();
    strtab.extend_from_slice(soname.as_bytes());
    strtab.push(0);
    let needed_at = strtab.len();
    strtab.extend_from_slice(needed.as_bytes());
    strtab.push(0);
    let total = str_off + strtab.len();

    let mut b = Vec::with_capacity(total);
    let u16 = |b: &mut Vec<u8>, v: u16| b.extend_from_slice(&v.to_le_bytes());
    let u32 = |b: &mut Vec<u8>, v: u32| b.extend_from_slice(&v.to_le_bytes());
    let u64 = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
    // e_ident: ELF, 64-bit, little-endian, version 1, System V ABI.
    b.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    u16(&mut b, 3); // ET_DYN
    u16(&mut b, MACHINE);
    u32(&mut b, 1); // EV_CURRENT
    u64(&mut b, 0); // e_entry
    u64(&mut b, EHDR as u64); // e_phoff
    u64(&mut b, 0); // e_shoff
    u32(&mut b, 0); // e_flags
    u16(&mut b, EHDR as u16);
    u16(&mut b, PHDR as u16);
    u16(&mut b, PHNUM as u16);
    u16(&mut b, 64); // e_shentsize
    u16(&mut b, 0); // e_shnum
    u16(&mut b, 0); // e_shstrndx
    let phdr = |b: &mut Vec<u8>, kind: u32, off: u64, size: u64, align: u64| {
        u32(b, kind);
        u32(b, 6); // PF_R | PF_W: the loader may relocate the dynamic section in place
        u64(b, off);
        u64(b, off); // p_vaddr
        u64(b, off); // p_paddr
        u64(b, size);
        u64(b, size);
        u64(b, align);
    };
    phdr(&mut b, 1, 0, total as u64, ALIGN); // PT_LOAD
    phdr(&mut b, 2, dyn_off as u64, (16 * DYN_ENTRIES) as u64, 8); // PT_DYNAMIC
    phdr(&mut b, 0x6474_e551, 0, 0, 16); // PT_GNU_STACK
    for (tag, val) in [
        (1u64, needed_at as u64),  // DT_NEEDED
        (14, soname_at as u64),    // DT_SONAME
        (4, hash_off as u64),      // DT_HASH
        (5, str_off as u64),       // DT_STRTAB
        (6, sym_off as u64),       // DT_SYMTAB
        (10, strtab.len() as u64), // DT_STRSZ
        (11, 24),                  // DT_SYMENT
        (0, 0),                    // DT_NULL
    ] {
        u64(&mut b, tag);
        u64(&mut b, val);
    }
    for v in [1u32, 1, 0, 0] {
        u32(&mut b, v); // nbucket, nchain, bucket[0], chain[0]: only the null symbol
    }
    b.extend_from_slice(&[0u8; 24]); // the null symbol
    b.extend_from_slice(&strtab);
    debug_assert_eq!(b.len(), total);
    b
}

/// Loads a stub named `soname` that needs `needed`, for the rest of the process.
pub(crate) fn install(soname: &str, needed: &Path) -> Result<(), String> {
    if MACHINE == 0 || !cfg!(target_os = "linux") {
        return Ok(());
    }
    let bytes = elf(soname, &needed.to_string_lossy());
    let mut errors = Vec::new();
    let dirs = [std::env::temp_dir()].into_iter().chain(std::env::var_os("XDG_RUNTIME_DIR").map(Into::into));
    // A file left by a process of the same id that died between writing and removing its stub
    // must not block this one: the name also holds the time.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    for dir in dirs {
        let path = dir.join(format!(".tandem-{}-{nanos}-{soname}", std::process::id()));
        if let Err(e) = write_private(&path, &bytes) {
            errors.push(format!("writing {}: {e}", path.display()));
            continue;
        }
        // SAFETY: the stub has no code and no initialisers; loading it loads `needed`, which
        // the caller has already loaded.
        let loaded = unsafe { libloading::Library::new(&path) };
        let _ = std::fs::remove_file(&path);
        match loaded {
            Ok(lib) => {
                std::mem::forget(lib);
                return Ok(());
            }
            Err(e) => errors.push(format!("loading the stub {}: {e}", path.display())),
        }
    }
    Err(errors.join("; "))
}

/// Creates `path` (which must not exist) readable and writable by this user alone, whatever
/// the umask, and writes `bytes` to it: no other user can replace the stub between its writing
/// and its loading, nor read which library this process loads.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    std::io::Write::write_all(&mut options.open(path)?, bytes)
}

#[cfg(test)]
mod tests {
    use super::{elf, write_private};

    #[cfg(unix)]
    #[test]
    fn the_stub_file_is_the_user_s_alone() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!(".tandem-stub-mode-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        write_private(&path, b"stub").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert!(write_private(&path, b"again").is_err(), "an existing file is never reused");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(mode, 0o600, "mode {mode:o}");
    }

    #[test]
    fn the_stub_names_its_soname_and_dependency_in_a_well_formed_header() {
        let b = elf("libnccl.so", "/opt/nccl/lib/libnccl.so.2");
        assert_eq!(&b[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([b[16], b[17]]), 3, "ET_DYN");
        assert_eq!(u16::from_le_bytes([b[56], b[57]]), 3, "three program headers");
        let text = String::from_utf8_lossy(&b);
        assert!(text.contains("libnccl.so\0/opt/nccl/lib/libnccl.so.2\0"), "{text:?}");
        let file_size = u64::from_le_bytes(b[64 + 32..64 + 40].try_into().unwrap());
        assert_eq!(file_size as usize, b.len(), "the load segment covers the whole file");
    }
}
