using System.Diagnostics.CodeAnalysis;
using System.Globalization;
using System.Net;
using System.Net.Sockets;

namespace TechEmpower;

/// <summary>What a <see cref="ListenUrl"/> binds to.</summary>
public enum ListenUrlKind
{
    /// <summary><c>http://*:port</c>, <c>http://+:port</c>: every address (IPv6 dual-mode, IPv4 where IPv6 is missing).</summary>
    AnyAddress,

    /// <summary><c>http://localhost:port</c>: the IPv4 and the IPv6 loopback address.</summary>
    Localhost,

    /// <summary><c>http://127.0.0.1:port</c>, <c>http://[::]:port</c>: one IP address.</summary>
    IPAddress,

    /// <summary><c>http://unix:/path/to.sock</c>: a Unix domain socket.</summary>
    UnixSocket,
}

/// <summary>
/// One address from <c>--urls</c>, in the forms Kestrel's <c>UseUrls</c> understands: <c>http://</c>, and
/// <c>https://</c> for TCP endpoints. Platform mode binds these itself (its connection handler must sit on
/// every endpoint), so the sample parses them in both modes and rejects what neither mode could serve.
/// </summary>
public sealed record ListenUrl
{
    private const string HttpScheme = "http://";
    private const string HttpsScheme = "https://";
    private const string UnixPrefix = "unix:";

    private ListenUrl(ListenUrlKind kind, IPAddress? address, int port, string? socketPath, bool isHttps = false)
    {
        Kind = kind;
        Address = address;
        Port = port;
        SocketPath = socketPath;
        IsHttps = isHttps;
    }

    /// <summary>What the URL binds to.</summary>
    public ListenUrlKind Kind { get; }

    /// <summary>True for <c>https://</c>: TLS on this endpoint, with the sample's certificate.</summary>
    public bool IsHttps { get; }

    /// <summary>The address, for <see cref="ListenUrlKind.IPAddress"/>.</summary>
    public IPAddress? Address { get; }

    /// <summary>The TCP port (0 lets the kernel pick one); 0 for a Unix socket.</summary>
    public int Port { get; }

    /// <summary>The socket's path, for <see cref="ListenUrlKind.UnixSocket"/>.</summary>
    public string? SocketPath { get; }

    /// <summary>Parses a <c>;</c>-separated list such as <c>http://*:8080;http://unix:/tmp/app.sock</c>.</summary>
    /// <param name="urls">The list.</param>
    /// <param name="result">The parsed URLs, in order, when every one was understood.</param>
    /// <param name="error">A message naming the first bad URL, when one was not.</param>
    /// <returns>True when every URL was understood.</returns>
    public static bool TryParseList(
        string urls,
        [NotNullWhen(true)] out IReadOnlyList<ListenUrl>? result,
        [NotNullWhen(false)] out string? error)
    {
        ArgumentNullException.ThrowIfNull(urls);

        var parsed = new List<ListenUrl>();
        foreach (var part in urls.Split(';', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries))
        {
            if (!TryParse(part, out var url, out error))
            {
                result = null;
                return false;
            }

            parsed.Add(url);
        }

        if (parsed.Count == 0)
        {
            result = null;
            error = "Option '--urls' needs at least one URL.";
            return false;
        }

        result = parsed;
        error = null;
        return true;
    }

    /// <summary>Parses one URL.</summary>
    /// <param name="url">For example <c>http://127.0.0.1:8080</c>, <c>https://*:8443</c> or <c>http://unix:/tmp/app.sock</c>.</param>
    /// <param name="result">The parsed URL, when it was understood.</param>
    /// <param name="error">Why it was not, naming the URL.</param>
    /// <returns>True when the URL was understood.</returns>
    public static bool TryParse(
        string url,
        [NotNullWhen(true)] out ListenUrl? result,
        [NotNullWhen(false)] out string? error)
    {
        ArgumentNullException.ThrowIfNull(url);
        result = null;

        bool https = url.StartsWith(HttpsScheme, StringComparison.OrdinalIgnoreCase);
        if (!https && !url.StartsWith(HttpScheme, StringComparison.OrdinalIgnoreCase))
        {
            error = $"Invalid URL '{url}': expected http://HOST:PORT, https://HOST:PORT or http://unix:/PATH.";
            return false;
        }

        var rest = url[(https ? HttpsScheme : HttpScheme).Length..];
        if (rest.StartsWith(UnixPrefix, StringComparison.OrdinalIgnoreCase))
        {
            if (https)
            {
                // The Unix socket is for the benchmark's nginx, which speaks plain HTTP to it; TLS between two
                // processes of one host would protect nothing the socket file's permissions do not.
                error = $"Invalid URL '{url}': a Unix socket is served as http://unix:/PATH only, not over TLS.";
                return false;
            }

            var path = rest[UnixPrefix.Length..];
            if (!path.StartsWith('/') || path.Length == 1)
            {
                error = $"Invalid URL '{url}': a Unix socket needs an absolute path, as in http://unix:/tmp/app.sock.";
                return false;
            }

            result = new ListenUrl(ListenUrlKind.UnixSocket, null, 0, path);
            error = null;
            return true;
        }

        // A trailing '/' is harmless; any other path would be a path base, which neither mode supports.
        if (rest.EndsWith('/'))
        {
            rest = rest[..^1];
        }

        if (rest.Contains('/', StringComparison.Ordinal) || rest.Contains('?', StringComparison.Ordinal))
        {
            error = $"Invalid URL '{url}': a path base is not supported.";
            return false;
        }

        string host;
        string? portText;
        if (rest.StartsWith('['))
        {
            var close = rest.IndexOf(']', StringComparison.Ordinal);
            if (close < 0)
            {
                error = $"Invalid URL '{url}': unclosed '[' in the IPv6 address.";
                return false;
            }

            host = rest[..(close + 1)];
            var after = rest[(close + 1)..];
            if (after.Length > 0 && after[0] != ':')
            {
                error = $"Invalid URL '{url}': expected ':PORT' after the IPv6 address.";
                return false;
            }

            portText = after.Length > 0 ? after[1..] : null;
        }
        else
        {
            var colon = rest.IndexOf(':', StringComparison.Ordinal);
            host = colon < 0 ? rest : rest[..colon];
            portText = colon < 0 ? null : rest[(colon + 1)..];
        }

        // Kestrel's default ports for http:// and https:// without one.
        var port = https ? 443 : 80;
        if (portText is not null
            && (!int.TryParse(portText, NumberStyles.None, CultureInfo.InvariantCulture, out port) || port > IPEndPoint.MaxPort))
        {
            error = $"Invalid URL '{url}': the port must be a number from 0 to {IPEndPoint.MaxPort}.";
            return false;
        }

        if (host is "*" or "+")
        {
            result = new ListenUrl(ListenUrlKind.AnyAddress, null, port, null, https);
        }
        else if (string.Equals(host, "localhost", StringComparison.OrdinalIgnoreCase))
        {
            if (port == 0)
            {
                // Kestrel refuses it too: the two loopback listeners could not share a kernel-picked port.
                error = $"Invalid URL '{url}': localhost needs a fixed port; use {(https ? HttpsScheme : HttpScheme)}127.0.0.1:0 for a dynamic one.";
                return false;
            }

            result = new ListenUrl(ListenUrlKind.Localhost, null, port, null, https);
        }
        // Four dotted parts only: IPAddress.TryParse also takes "10" as 0.0.0.10.
        else if (IPAddress.TryParse(host, out var address)
            && (host.StartsWith('[') || (address.AddressFamily == AddressFamily.InterNetwork && host.Count(c => c == '.') == 3)))
        {
            result = new ListenUrl(ListenUrlKind.IPAddress, address, port, null, https);
        }
        else
        {
            error = $"Invalid URL '{url}': the host must be *, +, localhost, an IPv4 address or a bracketed IPv6 address.";
            return false;
        }

        error = null;
        return true;
    }

    /// <summary>The URL in the form Kestrel prints it.</summary>
    /// <returns>For example <c>http://127.0.0.1:8080</c>.</returns>
    public override string ToString() => Kind switch
    {
        ListenUrlKind.UnixSocket => $"{HttpScheme}{UnixPrefix}{SocketPath}",
        ListenUrlKind.AnyAddress => $"{Scheme}*:{Port}",
        ListenUrlKind.Localhost => $"{Scheme}localhost:{Port}",
        _ => $"{Scheme}{new IPEndPoint(Address!, Port)}",
    };

    private string Scheme => IsHttps ? HttpsScheme : HttpScheme;
}
