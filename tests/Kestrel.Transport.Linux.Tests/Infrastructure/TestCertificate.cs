using System.Net;
using System.Runtime.CompilerServices;
using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>Self-signed server certificates made in the test, and clients that trust exactly one of them.</summary>
internal static class TestCertificate
{
    private const string ServerAuthenticationOid = "1.3.6.1.5.5.7.3.1";

    /// <summary>A fresh P-256 certificate for localhost and 127.0.0.1, reloaded from PFX so that Kestrel can use its private key.</summary>
    public static X509Certificate2 Create()
    {
        using var key = ECDsa.Create(ECCurve.NamedCurves.nistP256);
        var request = new CertificateRequest("CN=localhost", key, HashAlgorithmName.SHA256);
        var names = new SubjectAlternativeNameBuilder();
        names.AddDnsName("localhost");
        names.AddIpAddress(IPAddress.Loopback);
        request.CertificateExtensions.Add(names.Build());
        request.CertificateExtensions.Add(new X509BasicConstraintsExtension(certificateAuthority: false, hasPathLengthConstraint: false, pathLengthConstraint: 0, critical: true));
        request.CertificateExtensions.Add(new X509KeyUsageExtension(X509KeyUsageFlags.DigitalSignature, critical: true));
        request.CertificateExtensions.Add(new X509EnhancedKeyUsageExtension([new Oid(ServerAuthenticationOid)], critical: false));

        var now = DateTimeOffset.UtcNow;
        using var created = request.CreateSelfSigned(now.AddDays(-1), now.AddDays(1));
        return X509CertificateLoader.LoadPkcs12(created.Export(X509ContentType.Pfx), password: null);
    }

    /// <summary>
    /// A handler that accepts the server only if it presents exactly <paramref name="expected"/> (compared by
    /// SHA-256 thumbprint), and counts how often it was asked, so a test can check that it was.
    /// </summary>
    public static SocketsHttpHandler CreateHandlerTrusting(X509Certificate2 expected, StrongBox<int> validations)
    {
        var thumbprint = expected.GetCertHashString(HashAlgorithmName.SHA256);
        var handler = new SocketsHttpHandler();
        handler.SslOptions.RemoteCertificateValidationCallback = (_, presented, _, _) =>
        {
            Interlocked.Increment(ref validations.Value);
            return presented is not null && presented.GetCertHashString(HashAlgorithmName.SHA256) == thumbprint;
        };
        return handler;
    }
}
