//! Hooks for the `fvault2` fuzz driver (`crate::fuzzing`, feature
//! `fuzzing`): the encrypted metadata blocks are AES-XTS under a key in
//! the volume header and carry a CRC-32C, so a mutated block almost never
//! decrypts to one that passes; these parse plaintext blocks (their
//! checksum set here) with the same code, and decrypt a real image's
//! blocks to make the driver's seeds.

use super::*;

/// Bytes of one metadata block.
pub const BLOCK_LEN: usize = MD_BLOCK;

/// Parse plaintext metadata blocks (each `BLOCK_LEN` bytes; a short tail
/// is ignored) as `read` parses the decrypted ones, after setting each
/// block's checksum; true if every block the metadata needs was found.
pub fn parse_plain_blocks(blocks: &[u8]) -> Result<bool, LuksError> {
    let mut found = Found::default();
    for b in blocks.chunks_exact(MD_BLOCK) {
        let mut block = b.to_vec();
        block[4..8].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
        let crc = crc32c(0xffff_ffff, &block[8..]);
        block[..4].copy_from_slice(&crc.to_le_bytes());
        if !crc_ok(&block) {
            return Err(invalid("checksum set by the fuzz hook"));
        }
        match le16(&block, 10) {
            0x0019 => found.keys(&block)?,
            0x001a => found.volume(&block)?,
            0x0305 => found.log_vol_blkoff = Some(le32(&block, 104)),
            _ => {}
        }
    }
    Ok(found.keys.is_some() && found.volume.is_some() && found.log_vol_blkoff.is_some())
}

/// The decrypted metadata blocks of a real image, as `read` walks them
/// (for making seeds).
pub fn decrypt_for_seed(disk: &Disk) -> Result<Vec<u8>, LuksError> {
    let h = volume_header(disk)?;
    let (start, count) = disk_label(disk, h.block_size, h.label)?;
    let start = start
        .checked_mul(h.block_size)
        .ok_or_else(|| invalid("offset"))?;
    let mut out = Vec::new();
    for i in 0..count {
        let mut block = read_block(disk, start + i * MD_BLOCK as u64, MD_BLOCK)?;
        if block.iter().all(|&b| b == 0) {
            break;
        }
        xts_decrypt(&h.key, i, &mut block).ok_or_else(|| invalid("metadata key"))?;
        out.extend_from_slice(&block);
    }
    Ok(out)
}
