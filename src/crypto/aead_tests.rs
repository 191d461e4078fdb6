//! Known answers for [`super::SectorAead`], computed by an independent
//! implementation (python3-cryptography's AESGCM, ChaCha20Poly1305, AES-XTS
//! and HMAC) from dm-crypt's layout: associated data = LE64 relative sector
//! then IV; tuple = tag, then the IV when random. The generator script is
//! in the comment at the end of this file.

use super::*;

const GCM_KEY: &str = "01080f161d242b323940474e555c636a71787f868d949ba2a9b0b7bec5ccd3da";
const GCM_CT: &str = "546df8bc9ec248cd7bd3bc837b7a23d9507b53c99f453aaf5719cfc133e08e5e83bc94a235996976343e269def8785e7ba8d3112237199cdf3f4be33497c4dfff3e04cbb6e3330bff2b1b4bb4217d3036155f8e20c8c55778d84d71e410348772897a3e4d3062a3e0e9bb2f9083f89b857b66b3d22675fe540c1b45748f0f0d0200af03a700cb27122ab75830b7d42238ddb05385dcfec13acd5cf0103a6230a0506289b949032671c808ad7fb061032dbf897c6c7a55dba8c05b3bf85e3d15022384c07950f5f467cd96a16eb90a409422af4134abf2d35f69f2594613e3678cf55dccf515bd91ccf5477bc9d848868e2003ad38b975fd7f29d4caf21ccf5d61074e2f9182ca675d254994d772b713194b6e973669b37e3b68532309c50203c154d2944ec39a51f12c68fa5b7a91fbb115dcfe52a54ffbc26a9e6c78d1f95a55ff1a2df898d2c12b147ecd7f6dc0018ba58a03a0fa0347c9c98c29e7bf268a231c88f905107a6656fcafdd0c05185073606b5ac8ea5a8ad5ed8cd2def2a585d1e41803c45ec1dbd49d840eb2c13cd3087aa31fd2c2399445b38d2951d77f5b7f7753ea4cce51a5d7b565ff651e268d0d47f641cb2741efb1a16e36e448776ce73bc544f71219fdbeb75fcd8520005c5c90797022c626167f0bf83b89eb0b40bfa035ecde8951ba20023803dd2930ace1895c0c18441f9f73c5fa5eb41e726fa";
const GCM_TUPLE: &str = "82e2a9274e15dc838beaa39c24cb8fa6a0a1a2a3a4a5a6a7a8a9aaab";
const CHAPOLY_KEY: &str = "010c17222d38434e59646f7a85909ba6b1bcc7d2dde8f3fe09141f2a35404b56";
const CHAPOLY_CT: &str = "860895f2791caa42af4a35d5d3a26f3d44c73eba44fc4d42805a5f6e9fced4252b4006e2530d749f85b9720c8db96ee015c6beeca84aa562faad9148094160ae6db0e85d9191cb234cf08c3a200583f747c2f7f300f86c4648f28d8b3bdec0019be0734890aaa6f3ecbae26666d53c565ae3c2e740e913dcd22d4c2a48d701b59cb68404413fce6624a3bdfc63e6eec0c623751b5eb259c188ca0a9ac6d2d07c45c78c18b13aacea7a2b9dd4b9678b7206db380c522fe6a56cf09ff9ae228212ae462116a8b73604eaea665741994ab6a418f2b2cb6e72a078be6a50b67c2fd7eab0b9635b931f4ffbba09461554242e5b03ec2258b7aa9874228455578937544949e3da4d8e0b0841fc2729aba27997a1557bde4fdaf1466ea0bb542a88f5a2e43afc1ce9d8da403412c6cb746125ee6bb1c8c048683b513f4683978cda9321ed05bd5e3cc40738e98573cb7598f13ba43dce9f4e4fb63673cb74acba5a96a4f89763190a2dbe5e873725a4ba3f92f18146bcb644d13fc1f92cde9a39ce0b3c11e47edb338c59773c6f77a1a3fc53797ea81b2abc776ba00ae78f8e7aebb320706a1c049dd85b8a5fb63fc97213f62a71f10db335aa1299c2453f04d263dab30034b60cf4a6a8a74a963b6f4952f94a7aeab5ff176eebf1e7ca283c42115a15a219741810fb1d8713d56fbe9cbae484557838f9e7023002f75fa39ef943f0ed";
const CHAPOLY_TUPLE: &str = "d864783232033f05c6a8c0d0e8efbf73b0b1b2b3b4b5b6b7b8b9babb";
const AUTHENC256_KEY: &str = "0104070a0d101316191c1f2225282b2e3134373a3d404346494c4f5255585b5e6164676a6d707376797c7f8285888b8e9194979a9da0a3a6a9acafb2b5b8bbbec1c4c7cacdd0d3d6d9dcdfe2e5e8ebeef1f4f7fafd000306090c0f1215181b1e";
const AUTHENC256_CT: &str = "32f28df8ccbbaebac36173ac2e76913fa85de9fde944bae78879aa93a192cc5722c1119fee09fdc4bd28a2b5158e66b89a0922b8ffaf598de7cbe7eef8205dd860441ed8f47cdb4a5d6d66907eef0140d8586088c62f9e6988c6512aeadc71d4675effc4538872818fbd3bed9f7b8b0d894649fad632de9f8c6a934c1ef818cadd261de09fcc978f5ca8174ad50f722b05f3995f1a0c9d361ce260e0b096a0f060ae54790fe6db3ab2be8725ab06b9ce7cd7a3addb0f126cda50039f2071135f5c2e9fa7bdafc41226224d56f0b1d10176f2465f41ef5756529b362eab252d6818aac3bdb2aaff2eb65b133192c25fda12418f7144e5ab93be41d73c07ee6d77664ffed4d983ef318195621212b32bcc3b80562d28efb4b1c237e5468ad8f00e8028144085916a9e22d47d7ce66b30ca0f2b960a6728cac991511024ebe1bbdb9868ead4a376b975873ca430b52025c9181e41b61c0ffd9aa765b1f80326df5ea5106658026db758100a709767ad83e5780c40128506a4da8186ae39a1ee0f218f91c6338ea333364eb376fe1b90bde26506e9be1c28f77c0d6adec2c0e7fffb174b997d89560ff96e015bd76561232c44ed50b5cc5fffe7be3d62b344df56b7a1e03bed90f82581939aa4494832012408e70724162ac58e392cf7babf61bc0740e8c06d9da3ea985789c432bee275cf895ca8390608eb1de27c25a805f97b42";
const AUTHENC256_TUPLE: &str = "00df679624b57db3317194458f2482f5a14f37449a4c381eaf05156b87d9dd33c0c1c2c3c4c5c6c7c8c9cacbcccdcecf";
const AUTHENC512_KEY: &str = "01060b10151a1f24292e33383d42474c51565b60656a6f74797e83888d92979ca1a6abb0b5babfc4c9ced3d8dde2e7ecf1f6fb00050a0f14191e23282d32373c41464b50555a5f64696e73787d82878c91969ba0a5aaafb4b9bec3c8cdd2d7dce1e6ebf0f5faff04090e13181d22272c31363b40454a4f54595e63686d72777c";
const AUTHENC512_CT: &str = "67c401ebb566a182f2542905b45a29063bbe79fa31ec3ce290471076ec9282dbeedbebab84b6e26c410e8786432c7bba2a79fdbf274b7b8bd726431e33ce3b835b4f26fa72ee969946cc2651d4df42b2a74fa84b9da067560b77b6263b9c4ca6a9bd15cb30576d34a48becd35a98919d30efc92ae8a8ba27e14d4adfa662908bf06fa0a746748a13b13233f8daf638b3fc91c18709eb5b92b19561cbdb0d1be5be03027ccd5446e35415b6698d3d50b7ac5514b0426201fa05fd94d41c8e64f75ed48ce277ede539d0ea4cd3238ee83d1f89793291ae37ea88011222603018421e45ed4ccde7c9f2ceb1ee040eade07de74051a2e9ebbf11c57603f275c139d84e81f657bca2073b0246c8e9231c2e02b756f382676abe74806b11cbbe17b2a03b311f19a14f64f2a101f8927e224f862a6b6161d7aa1145b2a9a6e2ff28e23471cf83ff2009e005024081eca2ecb386f750c403e2bdeb1d6f608cf94ca70067cfa572ffadd1cfc68e04ef9fb2cf62c71614af4c6131b90f6a93917e61312d1655dc4a7269241a75466822f3eea9eeebf928632488e8128a4a778d0680b19378d9c72f4cdb268289967d47610f4a5340f5dad538d2dd8691c52c1f0b81f592070288bdc0c00705e14c391f25f222a459a1c7c90d24d7104bcf896438bb0219076a2143a095bca123fa2586efe114c3caea232ccd222b0e0505061727c91e3d93";
const AUTHENC512_TUPLE: &str = "8c3043f875e28948f66380d01a00588ebb7b5e3876a6d84fc9ce7ec495a23514e3e9306f825a05650bfc539e61c9565527e138bb097173d64c49797d0abe0f26";

/// The plaintext of every vector: 512 bytes, byte i = 13 i + 5.
fn plain() -> Vec<u8> {
    (0..512u32).map(|i| (i * 13 + 5) as u8).collect()
}

fn hx(s: &str) -> Vec<u8> {
    hex::decode(s).expect("test vector hex")
}

/// Opening the reference sector gives the plaintext; sealing it again
/// and opening that round-trips; a flipped bit anywhere fails.
fn check_random(spec: &str, key: &str, ct: &str, tuple: &str, rel: u64) {
    let t = hx(tuple);
    let a = SectorAead::new(spec, &hx(key), t.len(), 512, false).expect("keyed");
    let mut d = hx(ct);
    a.open(&mut d, &t, t.len(), rel + 100, rel)
        .expect("reference opens");
    assert_eq!(d, plain(), "{spec}: plaintext");
    // Sealing with a fresh random IV: the IV lands after the tag.
    let mut tags = vec![0xffu8; t.len()];
    a.seal(&mut d, &mut tags, t.len(), rel + 100, rel)
        .expect("seal");
    assert_ne!(d, plain());
    assert_ne!(
        &tags[t.len() - 12..],
        &t[t.len() - 12..],
        "{spec}: IV is random"
    );
    let mut again = d.clone();
    a.open(&mut again, &tags, t.len(), 0, rel)
        .expect("round trip");
    assert_eq!(again, plain());
    // The relative sector is authenticated.
    let mut moved = d.clone();
    assert_eq!(
        a.open(&mut moved, &tags, t.len(), 0, rel + 1),
        Err(AuthFailed(0))
    );
    for at in [0usize, 511] {
        let mut bad = hx(ct);
        bad[at] ^= 1;
        assert_eq!(a.open(&mut bad, &t, t.len(), 0, rel), Err(AuthFailed(0)));
    }
    let mut bad_iv = t.clone();
    *bad_iv.last_mut().expect("tuple") ^= 0x80;
    let mut d = hx(ct);
    assert_eq!(a.open(&mut d, &bad_iv, t.len(), 0, rel), Err(AuthFailed(0)));
}

#[test]
fn gcm_random_matches_the_reference() {
    check_random("capi:gcm(aes)-random", GCM_KEY, GCM_CT, GCM_TUPLE, 5);
    check_random("aes-gcm-random", GCM_KEY, GCM_CT, GCM_TUPLE, 5);
}

#[test]
fn chacha20_poly1305_random_matches_the_reference() {
    check_random(
        "capi:rfc7539(chacha20,poly1305)-random",
        CHAPOLY_KEY,
        CHAPOLY_CT,
        CHAPOLY_TUPLE,
        9,
    );
}

#[test]
fn xts_hmac_sha256_random_matches_the_reference() {
    check_random(
        "capi:authenc(hmac(sha256),xts(aes))-random",
        AUTHENC256_KEY,
        AUTHENC256_CT,
        AUTHENC256_TUPLE,
        3,
    );
}

#[test]
fn xts_hmac_sha512_plain64_seals_exactly_the_reference() {
    let a = SectorAead::new(
        "capi:authenc(hmac(sha512),xts(aes))-plain64",
        &hx(AUTHENC512_KEY),
        64,
        512,
        false,
    )
    .expect("keyed");
    // cc_sector 12 (the IV), relative sector 2 (iv_offset 10).
    let mut d = plain();
    let mut tags = [0u8; 64];
    a.seal(&mut d, &mut tags, 64, 12, 2).expect("seal");
    assert_eq!(hex::encode(&d), AUTHENC512_CT);
    assert_eq!(hex::encode(tags), AUTHENC512_TUPLE);
    a.open(&mut d, &tags, 64, 12, 2).expect("opens");
    assert_eq!(d, plain());
    // A stride wider than the tuple: zeros after it, as the kernel pads.
    let mut d = plain();
    let mut wide = [0xeeu8; 80];
    a.seal(&mut d, &mut wide, 80, 12, 2).expect("seal");
    assert_eq!(hex::encode(&wide[..64]), AUTHENC512_TUPLE);
    assert!(wide[64..].iter().all(|&b| b == 0));
}

#[test]
fn bad_specs_keys_and_tag_sizes_name_the_problem() {
    let k32 = [1u8; 32];
    let e = SectorAead::new("capi:gcm(aes)-essiv:sha256", &k32, 28, 512, false).unwrap_err();
    assert!(e.to_string().contains("IV mode"), "{e}");
    let e = SectorAead::new("capi:gcm(aes)-random", &k32, 32, 512, false).unwrap_err();
    assert!(e.to_string().contains("20 bytes"), "{e}");
    let e = SectorAead::new("capi:gcm(aes)-random", &[1u8; 24], 28, 512, false).unwrap_err();
    assert!(e.about_key() && e.to_string().contains("192 bits"), "{e}");
    let e = SectorAead::new(
        "capi:authenc(hmac(sha256),xts(aes))-random",
        &[1u8; 40],
        48,
        512,
        false,
    )
    .unwrap_err();
    assert!(e.about_key() && e.to_string().contains("HMAC key"), "{e}");
    // Two sectors with one tuple: refused, not half done.
    let a = SectorAead::new("capi:gcm(aes)-random", &k32, 28, 512, false).expect("keyed");
    let mut d = [0u8; 1024];
    let mut t = [0u8; 28];
    assert!(a.seal(&mut d, &mut t, 28, 0, 0).is_err());
    assert_eq!(d, [0u8; 1024]);
    assert_eq!(a.open(&mut d, &t, 28, 0, 0), Err(AuthFailed(0)));
    assert!(!is_aead_spec("aes-xts-plain64"));
    assert!(is_aead_spec("capi:rfc7539(chacha20,poly1305)-random"));
}

// The generator (python3-cryptography):
//   aad = struct.pack('<Q', rel) + iv
//   gcm/chapoly: ct = AEAD(key).encrypt(iv, data, aad); tuple = ct[-16:] + iv
//   authenc: c = AES-XTS(key[:64], tweak=iv)(data);
//            tag = HMAC(key[64:], aad + c); tuple = tag (+ iv when random)
// with data[i] = 13 i + 5, key[i] = i * m + 1 (m = 7, 11, 3, 5), the IVs
// a0.., b0.., c0.. and for plain64 LE64(12) padded to 16 bytes.
