using System.Collections.Concurrent;
using System.Net;
using System.Net.Security;
using System.Net.Sockets;
using System.Security.Cryptography.X509Certificates;
using System.Text;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>
/// TLS clients for the sample's https:// endpoints, which accept the sample's certificate only when it is the one the
/// sample makes for itself (or, with <see cref="Expect"/>, the one a test gave it), and remember every certificate the
/// server presented.
/// </summary>
public sealed class TlsClient
{
    private readonly ConcurrentQueue<X509Certificate2> _presented = new();
    private readonly ConcurrentQueue<string> _refusals = new();
    private readonly string? _thumbprint;

    private TlsClient(string? thumbprint) => _thumbprint = thumbprint;

    /// <summary>Every certificate a server presented to this client's connections.</summary>
    public IReadOnlyCollection<X509Certificate2> Presented => _presented;

    /// <summary>Why certificates were refused, for failure messages.</summary>
    public string Refusals => string.Join(Environment.NewLine, _refusals);

    /// <summary>A client that accepts the sample's own self-signed certificate only.</summary>
    /// <returns>The client.</returns>
    public static TlsClient SelfSigned() => new(null);

    /// <summary>A client that accepts exactly the given certificate only.</summary>
    /// <param name="certificate">The certificate the sample was given.</param>
    /// <returns>The client.</returns>
    public static TlsClient Expect(X509Certificate2 certificate) => new(certificate?.Thumbprint ?? throw new ArgumentNullException(nameof(certificate)));

    /// <summary>
    /// Why <paramref name="certificate"/> is not the sample's self-signed one (null when it is): subject and issuer
    /// <c>CN=localhost</c>, signed by its own key, an ECDSA P-256 key, the names localhost, 127.0.0.1 and ::1, for
    /// servers, valid now.
    /// </summary>
    /// <param name="certificate">The server's certificate.</param>
    /// <returns>Null, or the reason.</returns>
    public static string? WhyNotSelfSigned(X509Certificate2 certificate)
    {
        ArgumentNullException.ThrowIfNull(certificate);
        if (certificate.Subject != "CN=localhost" || certificate.Issuer != "CN=localhost")
        {
            return $"subject '{certificate.Subject}', issuer '{certificate.Issuer}'";
        }

        using (var ecdsa = certificate.GetECDsaPublicKey())
        {
            if (ecdsa?.KeySize != 256)
            {
                return $"key {certificate.PublicKey.Oid.FriendlyName} of {ecdsa?.KeySize} bits, not ECDSA P-256";
            }
        }

        var names = certificate.Extensions.OfType<X509SubjectAlternativeNameExtension>().SingleOrDefault();
        var dns = names?.EnumerateDnsNames().ToList() ?? [];
        var ips = names?.EnumerateIPAddresses().ToList() ?? [];
        if (!dns.SequenceEqual(["localhost"]) || !ips.SequenceEqual([IPAddress.Loopback, IPAddress.IPv6Loopback]))
        {
            return $"names {string.Join(", ", dns)} and {string.Join(", ", ips)}";
        }

        var usages = certificate.Extensions.OfType<X509EnhancedKeyUsageExtension>().SingleOrDefault();
        if (usages is null || !usages.EnhancedKeyUsages.Cast<System.Security.Cryptography.Oid>().Any(u => u.Value == "1.3.6.1.5.5.7.3.1"))
        {
            return "no Server Authentication usage";
        }

        if (certificate.NotBefore > DateTime.Now || certificate.NotAfter < DateTime.Now)
        {
            return $"valid from {certificate.NotBefore:O} to {certificate.NotAfter:O}";
        }

        // Trusting it alone, its chain builds: it is signed by its own key.
        using var chain = new X509Chain();
        chain.ChainPolicy.TrustMode = X509ChainTrustMode.CustomRootTrust;
        chain.ChainPolicy.CustomTrustStore.Add(certificate);
        chain.ChainPolicy.RevocationMode = X509RevocationMode.NoCheck;
        return chain.Build(certificate) && chain.ChainElements.Count == 1
            ? null
            : $"not signed by its own key: {string.Join("; ", chain.ChainStatus.Select(s => s.StatusInformation))}";
    }

    /// <summary>An HttpClient to <paramref name="baseUrl"/> that speaks <paramref name="version"/> only (ALPN picks it over TLS).</summary>
    /// <param name="baseUrl">The https:// URL.</param>
    /// <param name="version">1.1 or 2.0.</param>
    /// <returns>The client.</returns>
    public HttpClient HttpClient(string baseUrl, Version version) =>
        new(new SocketsHttpHandler
        {
            AllowAutoRedirect = false,
            UseCookies = false,
            SslOptions = new SslClientAuthenticationOptions { RemoteCertificateValidationCallback = Validate },
        })
        {
            BaseAddress = new Uri(baseUrl),
            Timeout = TestTimeouts.Request,
            DefaultRequestVersion = version,
            DefaultVersionPolicy = HttpVersionPolicy.RequestVersionExact,
        };

    /// <summary>Opens a TLS connection to <paramref name="url"/>, offering the given ALPN protocols (none: as wrk does).</summary>
    /// <param name="url">An https:// URL as the sample prints it.</param>
    /// <param name="protocols">The protocols to offer, in order of preference.</param>
    /// <param name="cancellationToken">Bounds the connect and the handshake.</param>
    /// <returns>The authenticated stream, which owns its socket.</returns>
    public async Task<SslStream> ConnectAsync(string url, IReadOnlyList<SslApplicationProtocol> protocols, CancellationToken cancellationToken)
    {
        var uri = new Uri(url);
        var socket = await ClientSocket.ConnectAsync(new IPEndPoint(IPAddress.Parse(uri.Host.Trim('[', ']')), uri.Port), cancellationToken);
        var stream = new SslStream(new NetworkStream(socket, ownsSocket: true));
        try
        {
            await stream.AuthenticateAsClientAsync(
                new SslClientAuthenticationOptions
                {
                    TargetHost = "localhost",
                    ApplicationProtocols = protocols.Count == 0 ? null : [.. protocols],
                    RemoteCertificateValidationCallback = Validate,
                },
                cancellationToken);
            return stream;
        }
        catch
        {
            await stream.DisposeAsync();
            throw;
        }
    }

    /// <summary>Reads HTTP/1.1 responses off <paramref name="stream"/> until <paramref name="count"/> bodies of
    /// <paramref name="body"/> have arrived; returns everything read.</summary>
    /// <param name="stream">The connection.</param>
    /// <param name="body">A body that occurs once per response.</param>
    /// <param name="count">How many responses.</param>
    /// <param name="cancellationToken">Bounds the reads.</param>
    /// <returns>The responses' text.</returns>
    public static async Task<string> ReadResponsesAsync(Stream stream, string body, int count, CancellationToken cancellationToken)
    {
        ArgumentNullException.ThrowIfNull(stream);
        var text = new StringBuilder();
        var buffer = new byte[16 * 1024];
        while (Occurrences(text.ToString(), body) < count)
        {
            var read = await stream.ReadAsync(buffer, cancellationToken);
            if (read == 0)
            {
                throw new IOException($"The server closed the connection after:{Environment.NewLine}{text}");
            }

            text.Append(Encoding.ASCII.GetString(buffer, 0, read));
        }

        return text.ToString();
    }

    /// <summary>How many times <paramref name="value"/> occurs in <paramref name="text"/>.</summary>
    /// <param name="text">The text.</param>
    /// <param name="value">What to count.</param>
    /// <returns>The count.</returns>
    public static int Occurrences(string text, string value)
    {
        ArgumentNullException.ThrowIfNull(text);
        var count = 0;
        for (var at = text.IndexOf(value, StringComparison.Ordinal); at >= 0; at = text.IndexOf(value, at + value.Length, StringComparison.Ordinal))
        {
            count++;
        }

        return count;
    }

    // Accepts the certificate the test expects and nothing else; the chain is untrusted by construction (no root store
    // holds it), so that is the one error allowed, and a name mismatch is not.
    private bool Validate(object sender, X509Certificate? certificate, X509Chain? chain, SslPolicyErrors errors)
    {
        if (certificate is null)
        {
            _refusals.Enqueue("no certificate");
            return false;
        }

        var presented = X509CertificateLoader.LoadCertificate(certificate.GetRawCertData());
        _presented.Enqueue(presented);
        var reason = (errors & ~SslPolicyErrors.RemoteCertificateChainErrors) != SslPolicyErrors.None
            ? $"policy errors {errors}"
            : _thumbprint is null
                ? WhyNotSelfSigned(presented)
                : presented.Thumbprint == _thumbprint ? null : $"thumbprint {presented.Thumbprint}, expected {_thumbprint}";
        if (reason is not null)
        {
            _refusals.Enqueue(reason);
        }

        return reason is null;
    }
}
