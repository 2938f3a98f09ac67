using System.Net;
using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>
/// Server certificates made by a test and written to a folder of its own, as PFX and PEM files, for <c>--certificate</c>;
/// the folder goes with disposal.
/// </summary>
public sealed class TestCertificates : IDisposable
{
    /// <summary>The password of <see cref="Pfx"/> and <see cref="EncryptedKeyPem"/>.</summary>
    public const string Password = "te-test-password";

    private TestCertificates(X509Certificate2 certificate, string folder)
    {
        Certificate = certificate;
        Folder = folder;
    }

    /// <summary>The certificate, with its key.</summary>
    public X509Certificate2 Certificate { get; }

    /// <summary>The folder holding the files.</summary>
    public string Folder { get; }

    /// <summary>The certificate and key as PKCS#12, protected by <see cref="Password"/>.</summary>
    public string Pfx => Path.Combine(Folder, "server.pfx");

    /// <summary>The certificate alone, as PEM.</summary>
    public string CertificatePem => Path.Combine(Folder, "server.crt.pem");

    /// <summary>The key alone, as unencrypted PKCS#8 PEM.</summary>
    public string KeyPem => Path.Combine(Folder, "server.key.pem");

    /// <summary>The key alone, as PKCS#8 PEM encrypted with <see cref="Password"/>.</summary>
    public string EncryptedKeyPem => Path.Combine(Folder, "server.key.encrypted.pem");

    /// <summary>The certificate and then its key in one PEM file.</summary>
    public string CombinedPem => Path.Combine(Folder, "server.pem");

    /// <summary>Makes a certificate for localhost and 127.0.0.1 with an RSA or an ECDSA key, and writes its files.</summary>
    /// <param name="rsa">True for RSA 2048, false for ECDSA P-384 (a key the sample never makes for itself).</param>
    /// <returns>The certificate and its files.</returns>
    public static TestCertificates Create(bool rsa)
    {
        using AsymmetricAlgorithm key = rsa ? RSA.Create(2048) : ECDsa.Create(ECCurve.NamedCurves.nistP384);
        var request = key is RSA r
            ? new CertificateRequest("CN=te-test", r, HashAlgorithmName.SHA256, RSASignaturePadding.Pkcs1)
            : new CertificateRequest("CN=te-test", (ECDsa)key, HashAlgorithmName.SHA384);
        var names = new SubjectAlternativeNameBuilder();
        names.AddDnsName("localhost");
        names.AddIpAddress(IPAddress.Loopback);
        request.CertificateExtensions.Add(names.Build());
        request.CertificateExtensions.Add(new X509EnhancedKeyUsageExtension([new Oid("1.3.6.1.5.5.7.3.1")], false));
        var certificate = request.CreateSelfSigned(DateTimeOffset.UtcNow.AddMinutes(-5), DateTimeOffset.UtcNow.AddDays(1));

        var folder = Directory.CreateTempSubdirectory("te-tests-certificates-").FullName;
        var files = new TestCertificates(certificate, folder);
        File.WriteAllBytes(files.Pfx, certificate.Export(X509ContentType.Pkcs12, Password));
        var encryption = new PbeParameters(PbeEncryptionAlgorithm.Aes256Cbc, HashAlgorithmName.SHA256, 100_000);
        var (keyPem, encryptedKeyPem) = key is RSA rsaKey
            ? (rsaKey.ExportPkcs8PrivateKeyPem(), rsaKey.ExportEncryptedPkcs8PrivateKeyPem(Password, encryption))
            : (((ECDsa)key).ExportPkcs8PrivateKeyPem(), ((ECDsa)key).ExportEncryptedPkcs8PrivateKeyPem(Password, encryption));
        File.WriteAllText(files.CertificatePem, certificate.ExportCertificatePem());
        File.WriteAllText(files.KeyPem, keyPem);
        File.WriteAllText(files.EncryptedKeyPem, encryptedKeyPem);
        File.WriteAllText(files.CombinedPem, certificate.ExportCertificatePem() + "\n" + keyPem);
        return files;
    }

    /// <inheritdoc />
    public void Dispose()
    {
        Certificate.Dispose();
        Directory.Delete(Folder, recursive: true);
    }
}
