using System.Net;

namespace TechEmpower.Tests.Units;

public sealed class ListenUrlTests
{
    [Theory]
    [InlineData("http://*:8080", ListenUrlKind.AnyAddress, null, 8080, "http://*:8080")]
    [InlineData("http://+:8080/", ListenUrlKind.AnyAddress, null, 8080, "http://*:8080")]
    [InlineData("http://localhost:5000", ListenUrlKind.Localhost, null, 5000, "http://localhost:5000")]
    [InlineData("HTTP://LOCALHOST:5000", ListenUrlKind.Localhost, null, 5000, "http://localhost:5000")]
    [InlineData("http://127.0.0.1:0", ListenUrlKind.IPAddress, "127.0.0.1", 0, "http://127.0.0.1:0")]
    [InlineData("http://0.0.0.0:80", ListenUrlKind.IPAddress, "0.0.0.0", 80, "http://0.0.0.0:80")]
    [InlineData("http://10.1.2.3", ListenUrlKind.IPAddress, "10.1.2.3", 80, "http://10.1.2.3:80")]
    [InlineData("http://[::]:8080", ListenUrlKind.IPAddress, "::", 8080, "http://[::]:8080")]
    [InlineData("http://[::1]:65535", ListenUrlKind.IPAddress, "::1", 65535, "http://[::1]:65535")]
    [InlineData("http://[::1]", ListenUrlKind.IPAddress, "::1", 80, "http://[::1]:80")]
    [InlineData("https://*:8443", ListenUrlKind.AnyAddress, null, 8443, "https://*:8443")]
    [InlineData("https://+:8443/", ListenUrlKind.AnyAddress, null, 8443, "https://*:8443")]
    [InlineData("HTTPS://LOCALHOST:5001", ListenUrlKind.Localhost, null, 5001, "https://localhost:5001")]
    [InlineData("https://127.0.0.1:0", ListenUrlKind.IPAddress, "127.0.0.1", 0, "https://127.0.0.1:0")]
    [InlineData("https://10.1.2.3", ListenUrlKind.IPAddress, "10.1.2.3", 443, "https://10.1.2.3:443")]
    [InlineData("https://[::1]:8443", ListenUrlKind.IPAddress, "::1", 8443, "https://[::1]:8443")]
    [InlineData("https://[::]", ListenUrlKind.IPAddress, "::", 443, "https://[::]:443")]
    public void Tcp_forms_parse(string url, ListenUrlKind kind, string? address, int port, string canonical)
    {
        Assert.True(ListenUrl.TryParse(url, out var parsed, out var error), error);
        Assert.Equal(kind, parsed.Kind);
        Assert.Equal(url.StartsWith("https", StringComparison.OrdinalIgnoreCase), parsed.IsHttps);
        Assert.Equal(address is null ? null : IPAddress.Parse(address), parsed.Address);
        Assert.Equal(port, parsed.Port);
        Assert.Null(parsed.SocketPath);
        Assert.Equal(canonical, parsed.ToString());
    }

    [Fact]
    public void Unix_socket_form_parses()
    {
        Assert.True(ListenUrl.TryParse("http://unix:/run/app/te.sock", out var parsed, out var error), error);
        Assert.Equal(ListenUrlKind.UnixSocket, parsed.Kind);
        Assert.Equal("/run/app/te.sock", parsed.SocketPath);
        Assert.Equal("http://unix:/run/app/te.sock", parsed.ToString());
        Assert.False(parsed.IsHttps);
    }

    [Theory]
    [InlineData("https://unix:/tmp/te.sock")]
    [InlineData("https://localhost:0")]
    [InlineData("https://example.com:443")]
    [InlineData("https://*:8443/base")]
    [InlineData("ftp://*:21")]
    [InlineData("*:8080")]
    [InlineData("http://unix:relative.sock")]
    [InlineData("http://unix:/")]
    [InlineData("http://example.com:80")]
    [InlineData("http://10:80")]
    [InlineData("http://localhost:0")]
    [InlineData("http://*:65536")]
    [InlineData("http://*:-1")]
    [InlineData("http://*:http")]
    [InlineData("http://*:8080/base")]
    [InlineData("http://[::1:8080")]
    [InlineData("http://[::1]8080")]
    [InlineData("http://::1:8080")]
    public void Other_forms_are_refused_naming_the_url(string url)
    {
        Assert.False(ListenUrl.TryParse(url, out var parsed, out var error));
        Assert.Null(parsed);
        Assert.Contains(url, error, StringComparison.Ordinal);
    }

    [Fact]
    public void Lists_keep_their_order_and_skip_empty_entries()
    {
        Assert.True(ListenUrl.TryParseList(" http://*:1 ;; http://unix:/tmp/a.sock;", out var urls, out var error), error);
        Assert.Equal(["http://*:1", "http://unix:/tmp/a.sock"], urls.Select(u => u.ToString()));

        Assert.True(ListenUrl.TryParseList("https://127.0.0.1:0;http://127.0.0.1:0", out urls, out error), error);
        Assert.Equal([true, false], urls.Select(u => u.IsHttps));
    }
}
