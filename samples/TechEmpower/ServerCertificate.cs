using System.Diagnostics.CodeAnalysis;
using System.Net;
using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;

namespace TechEmpower;

/// <summary>
/// The certificate of the sample's https:// endpoints: self-signed and made in memory at start-up, or loaded from
/// a PFX (PKCS#12) file or a PEM certificate and key.
/// </summary>
/// <remarks>
/// The self-signed key is ECDSA P-256, not RSA 2048, because a TLS benchmark here compares transports: the server's
/// one private-key operation per full handshake is the same work on every transport, and with RSA 2048 it would be
/// most of a handshake's CPU (a signature took 350 µs here against ECDSA P-256's 25 µs, <c>openssl speed rsa2048
/// ecdsap256</c> on the 2-CPU build machine under load), hiding the part that differs. P-256 is also what
/// certificates are issued with by default today (certbot 2.0 and later). An RSA certificate can still be measured
/// with <c>--certificate</c>.
/// </remarks>
public static class ServerCertificate
{
    /// <summary>The self-signed certificate's subject.</summary>
    public const string SelfSignedSubject = "CN=localhost";

    private const string ServerAuthentication = "1.3.6.1.5.5.7.3.1";

    /// <summary>Makes a self-signed ECDSA P-256 certificate for localhost, 127.0.0.1 and ::1, valid from now for 30 days.</summary>
    /// <returns>The certificate with its private key, which exists in memory only.</returns>
    public static X509Certificate2 CreateSelfSigned()
    {
        using var key = ECDsa.Create(ECCurve.NamedCurves.nistP256);
        var request = new CertificateRequest(SelfSignedSubject, key, HashAlgorithmName.SHA256);

        var names = new SubjectAlternativeNameBuilder();
        names.AddDnsName("localhost");
        names.AddIpAddress(IPAddress.Loopback);
        names.AddIpAddress(IPAddress.IPv6Loopback);
        request.CertificateExtensions.Add(names.Build());
        request.CertificateExtensions.Add(new X509BasicConstraintsExtension(false, false, 0, true));
        request.CertificateExtensions.Add(new X509KeyUsageExtension(X509KeyUsageFlags.DigitalSignature, true));
        request.CertificateExtensions.Add(new X509EnhancedKeyUsageExtension([new Oid(ServerAuthentication)], false));
        request.CertificateExtensions.Add(new X509SubjectKeyIdentifierExtension(request.PublicKey, false));

        // A little in the past, so that a client whose clock is a moment behind still accepts it.
        var now = DateTimeOffset.UtcNow;
        return request.CreateSelfSigned(now.AddMinutes(-5), now.AddDays(30));
    }

    /// <summary>Loads the certificate named on the command line.</summary>
    /// <param name="path">A PFX file, or a PEM file with the certificate (and its key, unless <paramref name="keyPath"/> is given).</param>
    /// <param name="keyPath">The PEM private key's file, or null.</param>
    /// <param name="password">The PFX's password or the encrypted PEM key's, or null.</param>
    /// <param name="certificate">The certificate with its private key, when it loaded.</param>
    /// <param name="error">Why it did not, naming the file.</param>
    /// <returns>True when the certificate loaded and can serve TLS.</returns>
    public static bool TryLoad(
        string path,
        string? keyPath,
        string? password,
        [NotNullWhen(true)] out X509Certificate2? certificate,
        [NotNullWhen(false)] out string? error)
    {
        ArgumentNullException.ThrowIfNull(path);
        certificate = null;
        foreach (var file in keyPath is null ? [path] : new[] { path, keyPath })
        {
            if (!File.Exists(file))
            {
                error = $"The certificate file '{file}' does not exist.";
                return false;
            }
        }

        X509Certificate2 loaded;
        try
        {
            var pem = keyPath is not null ? PemFile.Certificate : Inspect(path);
            if (pem == PemFile.CertificateWithoutKey)
            {
                error = $"The PEM file '{path}' holds no private key: give the key's file with --certificate-key.";
                return false;
            }

            loaded = pem == PemFile.NotPem
                ? X509CertificateLoader.LoadPkcs12FromFile(path, password)
                : LoadPem(path, keyPath, password);
        }
        catch (Exception e) when (e is CryptographicException or ArgumentException or IOException or UnauthorizedAccessException)
        {
            // The runtime's messages say what is wrong: a bad password, no certificate in the PEM, a key that does not match.
            error = $"The certificate '{path}'{(keyPath is null ? "" : $" with key '{keyPath}'")} cannot be loaded: {e.Message}";
            return false;
        }

        if (!loaded.HasPrivateKey)
        {
            loaded.Dispose();
            error = $"The certificate '{path}' has no private key{(keyPath is null ? ": give its key with --certificate-key" : "")}.";
            return false;
        }

        // Kestrel refuses such a certificate only when the server starts (exit 1); say so here, as a usage error.
        if (loaded.Extensions.OfType<X509EnhancedKeyUsageExtension>().FirstOrDefault() is { } usages
            && !usages.EnhancedKeyUsages.Cast<Oid>().Any(static u => u.Value == ServerAuthentication))
        {
            loaded.Dispose();
            error = $"The certificate '{path}' is not for servers: its extended key usage lacks Server Authentication ({ServerAuthentication}).";
            return false;
        }

        certificate = loaded;
        error = null;
        return true;
    }

    /// <summary>Names a certificate's key for the startup line, for example <c>ECDSA-256</c> or <c>RSA-2048</c>.</summary>
    /// <param name="certificate">The certificate.</param>
    /// <returns>The key's algorithm and size in bits.</returns>
    public static string KeyName(X509Certificate2 certificate)
    {
        ArgumentNullException.ThrowIfNull(certificate);
        using var ecdsa = certificate.GetECDsaPublicKey();
        if (ecdsa is not null)
        {
            return $"ECDSA-{ecdsa.KeySize}";
        }

        using var rsa = certificate.GetRSAPublicKey();
        return rsa is not null ? $"RSA-{rsa.KeySize}" : certificate.PublicKey.Oid.FriendlyName ?? certificate.PublicKey.Oid.Value ?? "unknown";
    }

    private static X509Certificate2 LoadPem(string path, string? keyPath, string? password) =>
        password is null
            ? X509Certificate2.CreateFromPemFile(path, keyPath)
            : X509Certificate2.CreateFromEncryptedPemFile(path, password, keyPath);

    private enum PemFile
    {
        NotPem,
        Certificate,
        CertificateWithoutKey,
    }

    // PEM is text with "-----BEGIN" lines; a PFX is DER, which starts with 0x30. A certificate with its key in one file
    // has a "-----BEGIN ... PRIVATE KEY-----" line (PRIVATE KEY, ENCRYPTED PRIVATE KEY, EC or RSA PRIVATE KEY).
    private static PemFile Inspect(string path)
    {
        Span<byte> head = stackalloc byte[64];
        using (var file = File.OpenRead(path))
        {
            var read = file.ReadAtLeast(head, head.Length, throwOnEndOfStream: false);
            if (head[..read].IndexOf("-----BEGIN "u8) < 0 && (read == 0 || head[0] == 0x30))
            {
                return PemFile.NotPem;
            }
        }

        return File.ReadAllText(path).Contains("PRIVATE KEY-----", StringComparison.Ordinal)
            ? PemFile.Certificate
            : PemFile.CertificateWithoutKey;
    }
}
