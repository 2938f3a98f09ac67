using System.Globalization;
using System.Net;
using System.Net.Http.Headers;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>
/// The response checks of TechEmpower's verifier: status 200 over HTTP/1.1; <c>Server</c>, <c>Date</c>
/// and <c>Content-Type</c> present, the type the test expects; <c>Content-Length</c> present and equal
/// to the body's length, or the body chunked.
/// </summary>
public static class TechEmpowerRules
{
    /// <summary>Checks a response read by HttpClient, from the headers exactly as received.</summary>
    /// <param name="response">The response.</param>
    /// <param name="mediaType">The expected media type, without parameters (charset may follow).</param>
    /// <returns>The body.</returns>
    public static async Task<byte[]> VerifyAsync(HttpResponseMessage response, string mediaType)
    {
        ArgumentNullException.ThrowIfNull(response);
        var body = await response.Content.ReadAsByteArrayAsync();
        Assert.True(response.StatusCode == HttpStatusCode.OK, $"Status {(int)response.StatusCode}, expected 200.");
        Assert.Equal(HttpVersion.Version11, response.Version);

        Assert.True(response.Headers.NonValidated.TryGetValues("Server", out var server) && server.Count == 1,
            "The Server header is missing.");
        Assert.True(response.Headers.NonValidated.TryGetValues("Date", out var date) && date.Count == 1,
            "The Date header is missing.");
        AssertHttpDate(date.ToString());

        Assert.True(response.Content.Headers.NonValidated.TryGetValues("Content-Type", out var contentType) && contentType.Count == 1,
            "The Content-Type header is missing.");
        Assert.Equal(mediaType, MediaTypeHeaderValue.Parse(contentType.ToString()).MediaType);

        var chunked = response.Headers.TransferEncodingChunked == true;
        if (response.Content.Headers.NonValidated.TryGetValues("Content-Length", out var length))
        {
            Assert.False(chunked, "Both Content-Length and chunked Transfer-Encoding were sent.");
            Assert.Equal(body.Length.ToString(CultureInfo.InvariantCulture), length.ToString());
        }
        else
        {
            Assert.True(chunked, "Neither Content-Length nor chunked Transfer-Encoding was sent.");
        }

        return body;
    }

    /// <summary>Checks a response read off a raw connection.</summary>
    /// <param name="response">The response.</param>
    /// <param name="mediaType">The expected media type, without parameters.</param>
    public static void Verify(RawHttpResponse response, string mediaType)
    {
        ArgumentNullException.ThrowIfNull(response);
        Assert.Equal(200, response.StatusCode);
        Assert.Single(response.Values("Server"));
        AssertHttpDate(Assert.Single(response.Values("Date")));
        Assert.Equal(mediaType, MediaTypeHeaderValue.Parse(Assert.Single(response.Values("Content-Type"))).MediaType);
        if (response.Value("Content-Length") is { } length)
        {
            Assert.False(response.IsChunked, "Both Content-Length and chunked Transfer-Encoding were sent.");
            Assert.Equal(response.Body.Length.ToString(CultureInfo.InvariantCulture), length);
        }
        else
        {
            Assert.True(response.IsChunked, "Neither Content-Length nor chunked Transfer-Encoding was sent.");
        }
    }

    /// <summary>Checks that a Date header value is an IMF-fixdate (RFC 9110 5.6.7).</summary>
    /// <param name="value">The value.</param>
    public static void AssertHttpDate(string value) =>
        Assert.True(
            DateTimeOffset.TryParseExact(value, "r", CultureInfo.InvariantCulture, DateTimeStyles.AssumeUniversal, out _),
            $"Date '{value}' is not an HTTP date.");
}
